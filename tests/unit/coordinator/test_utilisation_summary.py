"""summary.json carries the learner's MFU and tokens/s per device (means over the steps)."""

import json

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import MFU_UNKNOWN, TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.types import TrainStepResult

from .fakes import FakeLearner, FakeReward, FakeRollout, records


class MeteredLearner(FakeLearner):
    """Reports perf/mfu 0.1, 0.3, ... and 100, 300, ... tokens/s per device."""

    def __init__(self, rollouts, with_mfu: bool) -> None:  # type: ignore[no-untyped-def]
        super().__init__(rollouts)
        self.with_mfu = with_mfu

    def train_step(self, samples):  # type: ignore[no-untyped-def]
        result = super().train_step(samples)
        odd = 2 * len(self.batches) - 1
        metrics = {**result.metrics, "perf/tokens_per_s_per_device": 100.0 * odd}
        if self.with_mfu:
            metrics["perf/mfu"] = 0.1 * odd
        return TrainStepResult(result.policy_version, metrics)


def _run(tmp_path, with_mfu: bool):  # type: ignore[no-untyped-def]
    rollouts = [FakeRollout()]
    learner = MeteredLearner(rollouts, with_mfu)
    svc = Services(rollouts, FakeReward(), learner, ["r0"], decode=lambda ids: str(ids))
    cfg = CoordinatorConfig(num_steps=2, prompts_per_step=2, group_size=2, progress=False)
    summary = TrainingJob(cfg, svc, records(8), tmp_path).run()
    return summary, json.loads((tmp_path / "summary.json").read_text())


def test_summary_has_the_mean_mfu_and_tokens_per_s_per_device(tmp_path):
    summary, written = _run(tmp_path, with_mfu=True)
    assert summary.mfu is not None and abs(summary.mfu - 0.2) < 1e-12  # (0.1 + 0.3) / 2
    assert summary.tokens_per_s_per_device == 200.0
    assert written["mfu"] == summary.mfu and written["mfu_note"] == ""


def test_summary_without_mfu_says_why(tmp_path):
    summary, written = _run(tmp_path, with_mfu=False)
    assert summary.mfu is None and written["mfu"] is None
    assert written["mfu_note"] == MFU_UNKNOWN
    assert written["tokens_per_s_per_device"] == 200.0
