"""What the coordinator and ``RLTrainer`` need from the services, without a transport.

The gRPC clients (``hybridflow.services.*.client``) and the in-process twins (``LocalRollout``,
``RewardScorer``, ``LearnerCore``) both satisfy these Protocols, so one schedule drives
either. A failed call raises a ``hybridflow.errors`` class: ``BadRequest`` (a ValueError) for
refused input, ``Unavailable`` when the service cannot serve now, ``ResourceExhausted`` when
it sheds load, another ``ServiceError`` otherwise. Imports neither gRPC, torch nor numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from hybridflow.types import (
    Completion,
    RolloutStatus,
    SamplingParams,
    ScoreItem,
    ScoreResult,
    TrainSample,
    TrainStepResult,
    WeightUpdateReport,
)

if TYPE_CHECKING:  # numpy stays out of processes that never touch arrays (reward service)
    from hybridflow.arrays import FloatArray, TokenLike


class RolloutClient(Protocol):
    """One rollout replica."""

    def generate(
        self, prompts: Sequence[TokenLike], params: SamplingParams, request_id: str = ""
    ) -> list[list[Completion]]:
        """``params.n`` completions per prompt, in prompt order."""
        ...

    def status(self, timeout_s: float | None = None) -> RolloutStatus:
        """What the replica serves; ``timeout_s``: this call's deadline (None: the default)."""
        ...


class RewardClient(Protocol):
    """The reward service."""

    def score_batch(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """One result per item, in order."""
        ...


class LearnerClient(Protocol):
    """The learner (rank 0 of its group)."""

    def train_step(self, samples: list[TrainSample]) -> TrainStepResult: ...

    def compute_logprobs(
        self, prompts: Sequence[TokenLike], responses: Sequence[TokenLike], temperature: float
    ) -> list[FloatArray]: ...

    def publish_weights(self, targets: Sequence[str]) -> WeightUpdateReport: ...

    def save_checkpoint(self, path: str) -> str: ...

    def save_train_state(self, name: str) -> int:
        """Saves everything needed to resume under ``name``; returns the policy version."""
        ...

    def load_train_state(self, name: str) -> int:
        """Restores the train state saved under ``name``; returns its policy version."""
        ...

    def needs_greedy_baseline(self) -> bool:
        """Whether samples must carry their prompt's greedy baseline score (``baseline``:
        ReMax); the schedule then generates one greedy response per prompt."""
        ...

    def needs_routed_experts(self) -> bool:
        """Whether samples must carry the rollout's MoE routing (``routed_experts``; the
        learner replays it); the schedule then asks the rollout to report it."""
        ...
