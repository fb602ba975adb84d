"""Resume equivalence through deploy/launch.sh (slow): in sync mode with fixed seeds, a run
stopped at step 50 (SIGTERM to the launcher: the coordinator finishes its step and saves) and
resumed to step 100 ends with the same weights as an uninterrupted 100-step run."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.fault.harness import launch, trained_steps

SETS = ("coordinator.checkpoint_every=10", "coordinator.progress=false")


def _sets(*extra: str) -> list[str]:
    out = []
    for o in (*SETS, *extra):
        out += ["--set", o]
    return out


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    path = json.loads((run_dir / "summary.json").read_text())["checkpoint"]
    return dict(AutoModelForCausalLM.from_pretrained(path).state_dict())


LORA = ("learner.lora.rank=16", "learner.lora.alpha=32", "learner.optimizer.lr=2e-3")


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), LORA], ids=["full", "lora"])
def test_stop_at_50_resume_to_100_equals_uninterrupted(tmp_path: Path, extra) -> None:
    """With LoRA the train state holds only the adapters and their AdamW state; the merged
    export of the resumed run equals the uninterrupted one's."""
    straight = tmp_path / "straight"
    proc = launch(straight, "--run-dir", str(straight), *_sets("coordinator.num_steps=100", *extra))
    assert proc.wait(timeout=1800) == 0

    stopped = tmp_path / "stopped"
    proc = launch(stopped, "--run-dir", str(stopped), *_sets("coordinator.num_steps=50", *extra))
    assert proc.wait(timeout=1800) == 0 and trained_steps(stopped) == 50
    proc = launch(stopped, "--resume", str(stopped), "--set", "coordinator.num_steps=100")
    assert proc.wait(timeout=1800) == 0
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["resumed_from_step"] == 50 and trained_steps(stopped) == 100

    want, got = _final_weights(straight), _final_weights(stopped)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_sigterm_mid_run_then_resume_to_the_end(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = launch(run, "--run-dir", str(run), *_sets("coordinator.num_steps=100"))
    while trained_steps(run) < 30:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        time.sleep(0.2)  # polling another process's file: nothing to wait on locally
    os.kill(proc.pid, signal.SIGTERM)  # launch.sh execs the launcher: this is the launcher
    assert proc.wait(timeout=300) == 0
    stopped_at = trained_steps(run)
    proc = launch(run, "--resume", str(run))
    assert proc.wait(timeout=1800) == 0 and trained_steps(run) == 100
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == stopped_at
