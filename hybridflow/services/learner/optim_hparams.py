"""The AdamW hyperparameters the learner config sets, in one place: what the worker builds
its optimizers with, and what is put back into them after a checkpoint's optimizer state is
loaded (``set_state_dict`` restores each param group's ``lr``, ``betas`` and
``weight_decay`` as they were saved, which would silently undo a ``--set learner.optimizer.lr=...``
on resume). The moments (``exp_avg``, ``exp_avg_sq``, ``step``) stay the checkpoint's.

The lr is constant (no scheduler): the config's value is the lr in use. Knows the config and
torch optimizers; not checkpoints or files.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.services.learner.config import LearnerConfig


def adamw_hparams(config: LearnerConfig, module: str) -> dict[str, Any]:
    """The AdamW keyword arguments of ``module``'s ("actor" or "critic") optimizer."""
    return {
        "lr": config.critic.lr if module == "critic" else config.optimizer.lr,
        "betas": tuple(config.optimizer.betas),
        "weight_decay": config.optimizer.weight_decay,
    }


def apply_config_hparams(optim: torch.optim.Optimizer, config: LearnerConfig, module: str) -> None:
    """Sets every param group of ``optim`` to the hyperparameters ``config`` gives."""
    hparams = adamw_hparams(config, module)
    for group in optim.param_groups:
        group.update(hparams)


def optimizer_lr(optim: torch.optim.Optimizer) -> float:
    """The lr the optimizer steps with (what ``actor/lr`` reports)."""
    return float(optim.param_groups[0]["lr"])
