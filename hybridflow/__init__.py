"""hybridflow: RL post-training for language models as gRPC services.

``from hybridflow import RLTrainer`` gives the in-process API (``train_offline`` and
``PreferenceTrainer``: offline DPO / KTO / SFT); ``RLDataPipeline`` declares a job stage by
stage and runs it as services; the services live in
``hybridflow.services``, the single controller in ``hybridflow.coordinator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridflow._version import __version__

if TYPE_CHECKING:
    from hybridflow.pipeline import RLDataPipeline
    from hybridflow.preference.offline import PreferenceTrainer, train_offline
    from hybridflow.trainer import RLTrainer, StepResult

__all__ = [
    "PreferenceTrainer",
    "RLDataPipeline",
    "RLTrainer",
    "StepResult",
    "__version__",
    "train_offline",
]


def __getattr__(name: str) -> Any:
    # Lazy: importing hybridflow must not import torch (configs and --help stay instant).
    if name in ("RLTrainer", "StepResult"):
        from hybridflow import trainer

        return getattr(trainer, name)
    if name == "RLDataPipeline":
        from hybridflow.pipeline import RLDataPipeline

        return RLDataPipeline
    if name in ("PreferenceTrainer", "train_offline"):  # preference learning (DPO, KTO, SFT)
        from hybridflow.preference import offline

        return getattr(offline, name)
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")
