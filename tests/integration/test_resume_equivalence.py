"""Resume equivalence on the real model, learner and engine (in-process twins): a synchronous
run stopped after step 3 and resumed to step 6 ends with the same weights as an uninterrupted
6-step run. The slow fault suite does the same through deploy/launch.sh."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.coordinator.config import CoordinatorConfig, SamplingConfig
from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.job import TrainingJob
from tests.helpers import learner_config


class StopAfter(JobControl):
    """Asks the job to stop once step ``last`` is done (as SIGTERM would)."""

    def __init__(self, total: int, last: int) -> None:
        super().__init__(total)
        self.last = last

    def step_done(self, step: int, policy_version: int, metrics: dict[str, float]) -> None:
        super().step_done(step, policy_version, metrics)
        if step == self.last:
            self.stop()


def _job(model: Path, run_dir: Path, control: JobControl | None, resume: bool):
    from hybridflow.data.datasets import read_prompt_dataset
    from hybridflow.trainer import twin_services

    root = run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    twins = twin_services(
        model,
        learner_config(
            optimizer={"lr": 2e-3}, update={"micro_batch_size": 16}, checkpoint_dir=str(root)
        ),
        0,
    )
    cfg = CoordinatorConfig(
        num_steps=6,
        prompts_per_step=8,
        group_size=4,
        sampling=SamplingConfig(max_new_tokens=4),
        checkpoint_every=0,
        save_checkpoint=False,
        progress=False,
    )
    data = read_prompt_dataset("builtin:arith", twins.tokenizer, 40, 0, 512).records
    job = TrainingJob(cfg, twins.services, data, run_dir, control, resume, root)
    return job, twins.worker


def _weights(worker) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.full_state_dict_items()}


def test_stop_and_resume_matches_uninterrupted_run(tiny_model_path: Path, tmp_path: Path) -> None:
    job, straight = _job(tiny_model_path, tmp_path / "straight", None, False)
    assert job.run().num_steps == 6

    job, _ = _job(tiny_model_path, tmp_path / "resumed", StopAfter(6, 3), False)
    assert job.run().num_steps == 3
    job, resumed = _job(tiny_model_path, tmp_path / "resumed", None, True)
    summary = job.run()
    assert summary.resumed_from_step == 3 and summary.num_steps == 6
    assert resumed.policy_version == straight.policy_version == 6

    want, got = _weights(straight), _weights(resumed)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=1e-7, msg=name)
    initial = _weights(_job(tiny_model_path, tmp_path / "fresh", None, False)[1])
    assert any(not torch.allclose(initial[n], t) for n, t in want.items())  # it trained
