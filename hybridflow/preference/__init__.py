"""Offline preference learning (DPO, KTO) and SFT on the learner, in one process.

    from hybridflow.preference import train_offline
    result = train_offline("builtin:tiny", "builtin:arith_dpo", loss="dpo", steps=40)
    result.evals[-1]["eval/rewards/accuracies"]

Importing this package does not import torch (``PreferenceConfig`` is torch-free); the trainer
loads lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridflow.preference.config import PREFERENCE_LOSSES, PreferenceConfig

if TYPE_CHECKING:
    from hybridflow.preference.offline import OfflineResult, PreferenceTrainer, train_offline

__all__ = [
    "PREFERENCE_LOSSES",
    "OfflineResult",
    "PreferenceConfig",
    "PreferenceTrainer",
    "train_offline",
]


def __getattr__(name: str) -> Any:
    if name in ("OfflineResult", "PreferenceTrainer", "train_offline"):
        from hybridflow.preference import offline

        return getattr(offline, name)
    raise AttributeError(f"module 'hybridflow.preference' has no attribute {name!r}")
