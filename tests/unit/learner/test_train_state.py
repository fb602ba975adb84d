"""Train-state checkpoints: a restored worker continues exactly like the one that saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.services.learner.train_state import (
    COMPLETE,
    save_train_state,
)
from hybridflow.services.learner.worker import LearnerWorker
from tests.helpers import learner_config


def _worker(path: Path, algorithm: str) -> LearnerWorker:
    return LearnerWorker(
        learner_config(algorithm=algorithm, optimizer={"lr": 1e-2}, update={"micro_batch_size": 4}),
        path,
    )


def _params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    modules = {"actor": worker.actor, "critic": worker.critic}
    return {
        f"{m}.{n}": p.detach().clone()
        for m, module in modules.items()
        if module is not None
        for n, p in module.named_parameters()
    }


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_restored_worker_continues_like_the_original(
    tiny_checkpoint: Path, tmp_path: Path, make_samples, algorithm: str
) -> None:
    first = make_samples([1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 1.0])
    second = make_samples([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    original = _worker(tiny_checkpoint, algorithm)
    original.train_step(first)
    save_train_state(original, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / COMPLETE).exists()
    original.train_step(second)

    restored = _worker(tiny_checkpoint, algorithm)
    assert restored.load_train_state(tmp_path / "ckpt") == 1
    restored.train_step(second)

    assert restored.policy_version == original.policy_version == 2
    want, got = _params(original), _params(restored)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
    # A fresh worker that skipped the restore differs: the check above can fail.
    fresh = _worker(tiny_checkpoint, algorithm)
    fresh.train_step(second)
    assert any(not torch.equal(fresh_p, want[n]) for n, fresh_p in _params(fresh).items())


def test_partial_checkpoint_is_refused_and_complete_one_not_overwritten(
    tiny_checkpoint: Path, tmp_path: Path, make_samples
) -> None:
    worker = _worker(tiny_checkpoint, "grpo")
    partial = tmp_path / "partial"
    (partial / "dcp").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="not a complete"):
        worker.load_train_state(partial)
    save_train_state(worker, partial)  # a partial directory is cleared and rewritten
    assert (partial / COMPLETE).exists()
    with pytest.raises(FileExistsError):
        save_train_state(worker, partial)
