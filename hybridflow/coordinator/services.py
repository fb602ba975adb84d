"""The service clients one training job drives (gRPC clients or in-process twins)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow.arrays import TokenArray
from hybridflow.clients import LearnerClient, RewardClient, RolloutClient


@dataclass
class Services:
    """The clients one job drives; ``weight_targets`` name the replicas for weight publishes
    (one per rollout client, same order)."""

    rollouts: list[RolloutClient]
    reward: RewardClient
    learner: LearnerClient
    weight_targets: list[str]
    decode: Callable[[TokenArray], str]
    """Response tokens → text for the reward service."""
    environments: Any = None
    """Multi-turn (``coordinator.multi_turn``): the ``EnvironmentClient`` the episodes step
    (the environment service's client, or ``LocalEnvironments`` in process)."""
    tokenizer: Any = None
    """Multi-turn: the tokenizer whose chat template renders the observations."""
    connect_rollout: Callable[[str], RolloutClient] | None = None
    """A client for a replica at an address (``scale`` adds replicas with it); None: the
    job cannot reach new replicas (in-process twins)."""

    def __post_init__(self) -> None:
        if not self.rollouts:
            raise ValueError("at least one rollout replica is required")
        if len(self.weight_targets) != len(self.rollouts):
            raise ValueError(
                f"{len(self.weight_targets)} weight targets for {len(self.rollouts)} replicas"
            )
