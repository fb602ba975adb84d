"""A resumed learner trains with its own config's optimizer hyperparameters, not the saved
ones: the checkpoint's AdamW state brings back each param group's lr, betas and weight
decay, which ``load_train_state`` then sets from the config (issue 27, row 5). The moments
stay the checkpoint's, and ``actor/lr`` reports the lr the optimizer steps with."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.services.learner.train_state import save_train_state
from hybridflow.services.learner.worker import LearnerWorker
from tests.helpers import learner_config

SAVED = {
    "optimizer": {"lr": 1e-2, "betas": (0.9, 0.999), "weight_decay": 0.01},
    "critic": {"lr": 1e-5},
}
RESUMED = {
    "optimizer": {"lr": 1e-3, "betas": (0.8, 0.99), "weight_decay": 0.0},
    "critic": {"lr": 1e-4},
}


def _worker(path: Path, **hparams: object) -> LearnerWorker:
    base = {"algorithm": "ppo", "update": {"micro_batch_size": 4}}
    return LearnerWorker(learner_config(base, **hparams), path)


def _groups(optim: torch.optim.Optimizer) -> list[tuple[float, tuple[float, ...], float]]:
    return [(g["lr"], tuple(g["betas"]), g["weight_decay"]) for g in optim.param_groups]


def test_resumed_optimizer_follows_the_new_config(
    tiny_checkpoint: Path, tmp_path: Path, make_samples
) -> None:
    first = make_samples([1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 1.0])
    second = make_samples([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    original = _worker(tiny_checkpoint, **SAVED)
    original.train_step(first)
    save_train_state(original, tmp_path / "ckpt")
    saved_moments = [
        s["exp_avg"].clone() for s in original.actor_optim.state.values() if "exp_avg" in s
    ]

    resumed = _worker(tiny_checkpoint, **RESUMED)
    resumed.load_train_state(tmp_path / "ckpt")
    assert resumed.critic_optim is not None
    assert set(_groups(resumed.actor_optim)) == {(1e-3, (0.8, 0.99), 0.0)}
    assert set(_groups(resumed.critic_optim)) == {(1e-4, (0.8, 0.99), 0.0)}
    moments = [s["exp_avg"] for s in resumed.actor_optim.state.values() if "exp_avg" in s]
    assert len(moments) == len(saved_moments) > 0
    for got, want in zip(moments, saved_moments):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    result = resumed.train_step(second)
    assert result.metrics["actor/lr"] == 1e-3

    # The same resume under the saved config trains other weights: the lr is really used.
    unchanged = _worker(tiny_checkpoint, **SAVED)
    unchanged.load_train_state(tmp_path / "ckpt")
    assert unchanged.train_step(second).metrics["actor/lr"] == 1e-2
    differ = [
        not torch.equal(a, b)
        for a, b in zip(resumed.actor.parameters(), unchanged.actor.parameters())
    ]
    assert any(differ)
