"""Chooses the weight publisher a learner rank uses, from ``weight_sync``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hybridflow.weights.base import FullWeights, ReplicaWeightClient, SendPublisher, WeightPublisher
from hybridflow.weights.config import WeightSyncConfig

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch import nn


def make_publisher(
    config: WeightSyncConfig | None,
    *,
    rank: int,
    world_size: int,
    module: nn.Module,
    device: torch.device,
    full_weights: FullWeights,
    client_factory: Callable[[str], ReplicaWeightClient] | None,
    group: dist.ProcessGroup | None = None,
    whole: bool = False,
) -> WeightPublisher:
    """``transport: dist`` → ``DistPublisher``; ``grpc`` (or no config) → ``SendPublisher``
    streaming whole weights through ``client_factory``'s clients. ``rank`` / ``world_size``
    are within ``group``, the ranks holding the actor (None: the whole default group).
    ``whole``: ``module`` holds LoRA adapters, which every replica TP rank takes whole."""
    if config is not None and config.transport == "dist":
        from hybridflow.weights.dist_publisher import DistPublisher

        return DistPublisher(
            config, rank, world_size, module, device, client_factory, group, whole=whole
        )
    return SendPublisher(full_weights, rank, client_factory)
