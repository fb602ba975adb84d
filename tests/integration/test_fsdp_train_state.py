"""Train-state checkpoints under FSDP2: 2 gloo ranks save (each its shards, through
torch.distributed.checkpoint), then both a single process and 2 ranks resume from it and take
the next step; all three continuations agree with the ranks that never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers import build_tiny_checkpoint, learner_config
from tests.integration.test_fsdp_parity import (
    _free_port,
    _join_group,
    _leave_group,
    _samples,
    _spawn,
)

FIELDS: dict[str, Any] = {
    "algorithm": "ppo",
    "optimizer": {"lr": 1e-3},
    "critic": {"lr": 1e-3},
    "update": {"micro_batch_size": 2},
}


def _full(worker: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.full_state_dict_items()}


def _rank_main(rank: int, port: int, ckpt: str, out_dir: str, mode: str) -> None:
    _join_group(rank, port)
    from hybridflow.services.learner.train_state import save_train_state
    from hybridflow.services.learner.worker import LearnerWorker

    worker = LearnerWorker(learner_config(FIELDS), ckpt)
    samples = _samples()
    state_dir = Path(out_dir) / "state"
    if mode == "save":
        worker.train_step(samples)
        save_train_state(worker, state_dir)
        worker.train_step(list(reversed(samples)))
    else:
        worker.load_train_state(state_dir)
        worker.train_step(list(reversed(samples)))
    weights = _full(worker)
    if rank == 0:
        torch.save((worker.policy_version, weights), Path(out_dir) / f"{mode}.pt")
    _leave_group()


def test_fsdp2_train_state_resumes_on_two_ranks_and_on_one(tmp_path: Path) -> None:
    from hybridflow.services.learner.worker import LearnerWorker

    ckpt = build_tiny_checkpoint(tmp_path / "tiny")
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path), "save"))
    version, straight = torch.load(tmp_path / "save.pt", weights_only=False)
    assert version == 2 and sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "COMPLETE",
        "MANIFEST.json",
        "dcp",
        "rank0.pt",
        "rank1.pt",
    ]

    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path), "load"))
    version, two_ranks = torch.load(tmp_path / "load.pt", weights_only=False)
    assert version == 2
    for key, tensor in straight.items():
        torch.testing.assert_close(two_ranks[key], tensor, atol=0, rtol=0)

    single = LearnerWorker(learner_config(FIELDS), ckpt)
    assert single.load_train_state(tmp_path / "state") == 1
    single.train_step(list(reversed(_samples())))
    one_rank = _full(single)
    for key, tensor in straight.items():  # FSDP vs one process: reduction order only
        torch.testing.assert_close(one_rank[key], tensor, atol=1e-5, rtol=0)
    initial = _full(LearnerWorker(learner_config(FIELDS), ckpt))
    assert any(not torch.allclose(initial[k], t) for k, t in straight.items())
