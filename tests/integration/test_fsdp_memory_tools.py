"""FSDP2 over 2 gloo ranks with the learner's memory tools (packing, token-budget
micro-batches, chunked log-probs, all at once) equals one process without them: GRPO with a
sharded reference and PPO with a sharded critic.

The chunked head runs inside the root module's call, where FSDP2 has the root's parameters
(head, embeddings, final norm) unsharded, and is recomputed in the backward: this is the test
that the sharded gradients of those parameters still come out right.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from tests.helpers import build_tiny_checkpoint, learner_config
from tests.integration.test_fsdp_parity import (
    _free_port,
    _join_group,
    _leave_group,
    _run_commands,
    _spawn,
)

CONFIGS: dict[str, dict[str, Any]] = {
    "grpo": {
        "algorithm": "grpo",
        "optimizer": {"lr": 1e-3},
        "update": {"micro_batch_size": 2, "epochs": 2},
        "kl": {"use_reference": True, "coef": 0.05},
        "loss": {"entropy_coef": 0.01},
    },
    "ppo": {
        "algorithm": "ppo",
        "optimizer": {"lr": 1e-3},
        "critic": {"lr": 1e-3},
        "update": {"micro_batch_size": 2, "num_mini_batches": 2},
        "advantage": {"lam": 0.9},
    },
}
MEMORY = LearnerMemoryConfig(packing=True, max_tokens_per_micro_batch=14, logprob_chunk_tokens=3)


def _rank_main(rank: int, port: int, ckpt: str, out_dir: str) -> None:
    _join_group(rank, port)

    from hybridflow.services.learner.distributed import CommandRelay
    from hybridflow.services.learner.worker import LearnerWorker

    results: dict[str, Any] = {}
    for name, fields in CONFIGS.items():
        worker = LearnerWorker(learner_config(fields, memory=MEMORY), ckpt)

        def handler(command: str, args: Any, worker: LearnerWorker = worker) -> Any:
            return None if command == "shutdown" else getattr(worker, command)(*args)

        relay = CommandRelay(handler)
        if rank == 0:
            results[name] = _run_commands(relay.call, Path(out_dir) / f"fsdp-{name}")
            relay.shutdown()
        else:
            relay.serve()
    if rank == 0:
        torch.save(results, Path(out_dir) / "ranks.pt")
    _leave_group()


def test_fsdp2_memory_tools_match_a_plain_single_process(tmp_path: Path) -> None:
    from hybridflow.services.learner.worker import LearnerWorker

    ckpt = build_tiny_checkpoint(tmp_path / "tiny")
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path)))
    ranks = torch.load(tmp_path / "ranks.pt", weights_only=False)
    for name, fields in CONFIGS.items():
        worker = LearnerWorker(learner_config(fields), ckpt)
        want = _run_commands(
            lambda command, args, w=worker: getattr(w, command)(*args), tmp_path / f"one-{name}"
        )
        got = ranks[name]
        assert got["version"] == want["version"]
        assert set(got["metrics"]) == set(want["metrics"]), name
        for key, value in want["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, abs=1e-5, rel=1e-5), (name, key)
        for row_got, row_want in zip(got["logprobs"], want["logprobs"], strict=True):
            assert row_got == pytest.approx(row_want, abs=1e-5)
        for key, tensor in want["weights"].items():
            torch.testing.assert_close(got["weights"][key], tensor, atol=1e-5, rtol=0)
        assert want["metrics"]["actor/grad_norm"] > 0
