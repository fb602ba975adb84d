"""MoE router replay through the real services: deploy/launch.sh with a Qwen3-MoE checkpoint,
a bf16 vLLM rollout and ``learner.moe_router_replay``. Every sample's routing (prompt and
response) reaches the learner, which replays it; the weights go back over torch.distributed
in bf16. That the replay changes the learner's forward is ``tests/unit/learner``'s, that the
record equals the model's routing is ``tests/integration/test_vllm_routing.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import vllm  # noqa: F401  (locked: a broken install fails here, never skips)

from tests.e2e.test_launch import launch, metric_lines
from tests.family_checkpoints import build_family_checkpoint
from tests.fault.harness import finish


@pytest.mark.slow
def test_a_launched_moe_run_replays_the_rollouts_routing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_family_checkpoint(tmp_path / "moe", "qwen3_moe", False)
    run_dir = tmp_path / "run"
    proc = launch(
        run_dir,
        f"model={model}",
        "rollout.engine=vllm",
        "rollout.dtype=bfloat16",
        "learner.moe_router_replay=true",
        "coordinator.num_steps=3",
        "coordinator.prompts_per_step=8",
        "coordinator.save_checkpoint=false",
        "coordinator.progress=false",
    )
    code, out = finish(proc, 600)  # a timed-out launch takes its services with it
    assert code == 0, out
    steps = metric_lines(run_dir)
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        # one routed row per token the rollout read: prompt + response - 1, for all 64 samples
        read = 64 * (m["prompt_length/mean"] + m["response_length/mean"] - 1)
        assert m["training/router_replay_tokens"] == pytest.approx(read), m
        assert m["training/rollout_probs_diff_max"] < 0.05
    assert json.loads((run_dir / "summary.json").read_text())["num_steps"] == 3
