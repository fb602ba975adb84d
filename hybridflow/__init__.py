"""hybridflow: RL post-training for language models as gRPC services.

``from hybridflow import RLTrainer`` gives the in-process API; the services live in
``hybridflow.services``, the single controller in ``hybridflow.coordinator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridflow._version import __version__

if TYPE_CHECKING:
    from hybridflow.trainer import RLTrainer, StepResult

__all__ = ["RLTrainer", "StepResult", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: importing hybridflow must not import torch (configs and --help stay instant).
    if name in ("RLTrainer", "StepResult"):
        from hybridflow import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")
