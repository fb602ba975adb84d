"""Resume with changes on the real model, learner and engine (in-process twins, the code
path deploy/launch.sh runs, without the processes): a stopped run resumed with a smaller
``prompts_per_step`` and a higher ``lr`` completes with the exactly-once audit clean, the
new batch size, and the optimizer stepping with the new lr (which ``actor/lr`` reports);
a resume that changes the prompt order's seed is refused at once, naming the key, before
the learner loads anything (issue 27, rows 3, 5 and 7)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from hybridflow.coordinator.checkpoint_config import ResumeRefused
from hybridflow.coordinator.config import CoordinatorConfig, SamplingConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.metrics import read_step_lines
from hybridflow.job_config import JobConfig
from tests.fault.harness import audit
from tests.helpers import learner_config

NUM_ROWS = 20


def _job(model: Path, run_dir: Path, twins, resume: bool, lr: float, **coordinator):  # type: ignore[no-untyped-def]
    from hybridflow.data.datasets import read_prompt_dataset

    root = run_dir / "checkpoints"
    cfg = CoordinatorConfig(
        **{
            "num_steps": 3,
            "prompts_per_step": 8,
            "group_size": 2,
            "sampling": SamplingConfig(max_new_tokens=4),
            "checkpoint_every": 0,
            "save_checkpoint": False,
            "progress": False,
            **coordinator,
        }
    )
    learner = learner_config(
        optimizer={"lr": lr}, update={"micro_batch_size": 16}, checkpoint_dir=str(root)
    )
    resolved = asdict(JobConfig(learner=learner, coordinator=cfg))
    data = read_prompt_dataset("builtin:arith", twins.tokenizer, NUM_ROWS, cfg.seed, 512).records
    return TrainingJob(
        cfg, twins.services, data, run_dir, None, resume, root, resolved_config=resolved
    )


def _twins(model: Path, run_dir: Path, lr: float):  # type: ignore[no-untyped-def]
    from hybridflow.trainer import twin_services

    root = run_dir / "checkpoints"
    return twin_services(
        model,
        learner_config(
            optimizer={"lr": lr}, update={"micro_batch_size": 16}, checkpoint_dir=str(root)
        ),
    )


def test_resume_rebases_the_batch_applies_the_lr_and_refuses_the_seed(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = _twins(tiny_model_path, run_dir, lr=2e-3)
    assert _job(tiny_model_path, run_dir, first, False, 2e-3).run().num_steps == 3

    resumed = _twins(tiny_model_path, run_dir, lr=1e-2)  # the new learner process's config
    start = time.monotonic()
    with pytest.raises(ResumeRefused, match=r"coordinator\.seed 0 -> 7") as refused:
        _job(tiny_model_path, run_dir, resumed, True, 1e-2, num_steps=6, seed=7).run()
    refusal_s = time.monotonic() - start
    assert "\n" not in str(refused.value) and refusal_s < 1.0, refusal_s
    assert resumed.worker.policy_version == 0, "the learner loaded before the refusal"

    job = _job(tiny_model_path, run_dir, resumed, True, 1e-2, num_steps=6, prompts_per_step=4)
    summary = job.run()
    assert summary.resumed_from_step == 3 and summary.num_steps == 6
    audit(run_dir, 6, {1: 8, 2: 8, 3: 8, 4: 4, 5: 4, 6: 4})
    assert {g["lr"] for g in resumed.worker.actor_optim.param_groups} == {1e-2}
    metrics = read_step_lines(run_dir / "metrics.jsonl")
    assert [m["actor/lr"] for m in metrics] == [2e-3] * 3 + [1e-2] * 3
    saved = json.loads((run_dir / "checkpoints/step_00000006/config.json").read_text())
    assert (
        saved["learner"]["optimizer"]["lr"] == 1e-2
        and saved["coordinator"]["prompts_per_step"] == 4
    )
