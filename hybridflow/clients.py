"""What the coordinator and ``RLTrainer`` need from the services, without a transport.

The gRPC clients (``hybridflow.services.*.client``) and the in-process twins (``LocalRollout``,
``RewardScorer``, ``LearnerCore``) both satisfy these Protocols, so one schedule drives
either. A failed call raises a ``hybridflow.errors`` class: ``BadRequest`` (a ValueError) for
refused input, ``Unavailable`` when the service cannot serve now, ``ResourceExhausted`` when
it sheds load, another ``ServiceError`` otherwise. Imports neither gRPC, torch nor numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from hybridflow.types import (
    Completion,
    LearnerNeeds,
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


@runtime_checkable
class PublishesInBackground(Protocol):
    """A learner whose weight publish can run beside its next train step (the gRPC client
    and ``LearnerCore``; a learner without it publishes synchronously)."""

    def start_publish(self, targets: Sequence[str]) -> int:
        """Begins a publish of the current weights; returns its version once the next
        train step may run (the weights are snapshotted, their send under way)."""
        ...

    def finish_publish(self) -> WeightUpdateReport:
        """Waits for that publish; its report once every target holds the weights. Raises
        (a ``ServiceError`` over gRPC) if they may not."""
        ...


class PendingTrainStep(Protocol):
    """A train step on its way to the learner (``TrainsAhead.send_train_step``)."""

    def done(self) -> bool:
        """Whether it ended (its result, or its error, is in), without waiting."""
        ...

    def result(self) -> TrainStepResult:
        """Waits for the step; raises what failed it (a ``ServiceError`` over gRPC)."""
        ...

    def cancel(self) -> None:
        """Gives the step up (a job that failed meanwhile): the learner refuses it if it
        had not started it yet."""
        ...


@runtime_checkable
class TrainsAhead(Protocol):
    """A learner that takes the next train step while the current one trains (the gRPC
    client): each step names the policy version it must start from, so they run in order
    whatever order they arrive in, and begins its own publish once done (one round trip,
    not two, and no gap between the step and the publish's start)."""

    def send_train_step(
        self, samples: list[TrainSample], start_version: int, publish_to: Sequence[str]
    ) -> PendingTrainStep:
        """Sends a step without waiting for it. It runs once the learner holds
        ``start_version`` (refused if the learner is past it, or if the step before it
        failed); then, if ``publish_to`` names replicas, it starts their publish as
        ``start_publish`` does, after the previous publish was reported
        (``finish_publish``)."""
        ...


class LearnerClient(Protocol):
    """The learner (rank 0 of its group)."""

    def train_step(self, samples: list[TrainSample]) -> TrainStepResult: ...

    def compute_logprobs(
        self, prompts: Sequence[TokenLike], responses: Sequence[TokenLike], temperature: float
    ) -> list[FloatArray]: ...

    def publish_weights(self, targets: Sequence[str], catch_up: bool = False) -> WeightUpdateReport:
        """The current weights to ``targets``: the whole serving set (the learner lets go of
        the replicas it no longer names), or with ``catch_up`` only replicas that join or
        come back, the others left as they are."""
        ...

    def save_checkpoint(self, path: str) -> str: ...

    def save_train_state(self, name: str) -> int:
        """Saves everything needed to resume under ``name``; returns the policy version."""
        ...

    def load_train_state(self, name: str) -> int:
        """Restores the train state saved under ``name``; returns its policy version."""
        ...

    def schedule_needs(self) -> LearnerNeeds:
        """What the schedule must know before the first step: greedy baselines (ReMax), MoE
        routing to replay, and the versions one train step adds."""
        ...
