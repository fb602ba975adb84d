"""What one learner rank does per command, the same on every rank of the SPMD group.

Rank 0's servicer relays each command to all ranks (``CommandRelay``), so collective work
(FSDP gathers inside ``full_state_dict_items``, checkpoint saves) happens everywhere while
only rank 0 talks to the outside (the weight publisher's replica clients). Knows nothing
of gRPC servers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.arrays import FloatArray, TokenLike
from hybridflow.types import LearnerNeeds, TrainSample, TrainStepResult, WeightUpdateReport
from hybridflow.weights.base import ReplicaWeightClient, WeightPublisher
from hybridflow.weights.config import WeightSyncConfig

if TYPE_CHECKING:
    import torch

    from hybridflow.services.learner.worker import LearnerWorker


class LearnerCore:
    """What the learner service does, transport-free: train steps, log-probs, weight publishes
    and checkpoints on the ``LearnerWorker``, with the timings the coordinator reports. The
    gRPC servicer and the in-process twin both call it."""

    def __init__(
        self,
        worker: LearnerWorker,
        rank: int = 0,
        weight_sync: WeightSyncConfig | None = None,
        client_factory: Callable[[str], ReplicaWeightClient] | None = None,
        publisher: WeightPublisher | None = None,
    ) -> None:
        """Weights go out through ``publisher``, or one ``make_publisher`` builds from
        ``weight_sync`` on first use (replicas reached through ``client_factory``)."""
        self.worker = worker
        self.rank = rank
        self._weight_sync = weight_sync
        self._client_factory = client_factory
        self._publisher = publisher
        self._started: int | None = None
        """The version ``start_publish`` began sending, until ``finish_publish``."""

    @property
    def policy_version(self) -> int:
        return self.worker.policy_version

    def needs_greedy_baseline(self) -> bool:
        """The estimator needs each prompt's greedy baseline score on its samples (ReMax);
        False for the presets without one (dpo, rft)."""
        estimator = self.worker.estimator
        return estimator is not None and estimator.needs_baseline

    def needs_routed_experts(self) -> bool:
        """Samples must carry the rollout's MoE routing (``learner.moe_router_replay``)."""
        return bool(self.worker.config.moe_router_replay)

    def schedule_needs(self) -> LearnerNeeds:
        """Greedy baselines, routing replay and versions per step, as the schedule asks."""
        return LearnerNeeds(
            greedy_baseline=self.needs_greedy_baseline(),
            routed_experts=self.needs_routed_experts(),
            versions_per_step=self.worker.versions_per_step(),
        )

    def train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        start = time.perf_counter()
        result = self.worker.train_step(samples)
        # Lets callers split their RPC time into compute and batch transfer.
        seconds = time.perf_counter() - start
        result.metrics["timing_s/learner_compute"] = seconds
        result.metrics.update(self.worker.utilisation_metrics(samples, seconds))
        return result

    def compute_logprobs(
        self, prompts: Sequence[TokenLike], responses: Sequence[TokenLike], temperature: float
    ) -> list[FloatArray]:
        return self.worker.compute_logprobs(prompts, responses, temperature)

    def full_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Full, unsharded weights (a collective under FSDP; rank 0 gets the tensors)."""
        return list(self.worker.full_state_dict_items())

    def publish_weights(self, targets: Sequence[str]) -> WeightUpdateReport:
        """Sends the current weights to every target (a collective on every rank that holds
        the actor: the sources; critic ranks of a split learner take no part)."""
        if not self.worker.has_actor:
            return WeightUpdateReport(self.worker.policy_version, 0, 0.0)
        return self._get_publisher().publish(targets, self.worker.policy_version)

    def start_publish(self, targets: Sequence[str]) -> int:
        """Begins a publish of the current weights (every rank, relayed like
        ``publish_weights``) and returns its version once the next ``train_step`` may run:
        each rank has copied its shards, and their send runs beside it (the ``dist``
        transport; ``grpc`` sends at once). ``finish_publish`` reports it."""
        version = self.worker.policy_version
        if self.worker.has_actor:
            self._get_publisher().start(targets, version)
        self._started = version
        return version

    def finish_publish(self) -> WeightUpdateReport:
        """Waits for the publish ``start_publish`` began, on this rank only (rank 0: until
        every target has the weights); it takes no lock, so train steps go on meanwhile."""
        if self._started is None:
            raise ValueError("no publish in flight: StartPublish first")
        version, self._started = self._started, None
        if not self.worker.has_actor:
            return WeightUpdateReport(version, 0, 0.0)
        return self._get_publisher().finish()

    def _get_publisher(self) -> WeightPublisher:
        if self._publisher is None:
            from hybridflow.weights.publishers import make_publisher

            role = self.worker.role
            self._publisher = make_publisher(
                self._weight_sync,
                rank=role.group_rank,
                world_size=role.group_size,
                module=self.worker.actor,
                device=self.worker.device,
                full_weights=self.full_weights,
                client_factory=self._client_factory,
                group=role.group,
            )
        return self._publisher

    def save_checkpoint(self, name: str) -> str:
        """The actor as a Hugging Face checkpoint under ``learner.checkpoint_dir/name`` (a new
        directory: an existing one is never overwritten)."""
        path = self.checkpoint_path(name)
        self.worker.save_checkpoint(path)
        return str(path)

    def save_train_state(self, name: str) -> int:
        """Everything needed to resume, under ``learner.checkpoint_dir/name`` (every rank)."""
        from hybridflow.services.learner.train_state import save_train_state

        save_train_state(self.worker, self.checkpoint_path(name))
        return self.worker.policy_version

    def load_train_state(self, name: str) -> int:
        """Restores a train state saved under ``name``; returns the restored policy version."""
        return self.worker.load_train_state(self.checkpoint_path(name, must_exist=True))

    def checkpoint_path(self, name: str, must_exist: bool = False) -> Path:
        """``name`` resolved inside ``learner.checkpoint_dir``: ValueError if it leaves it,
        AlreadyExists when saving over an existing one, FileNotFoundError for a missing one."""
        from hybridflow.services.learner.checkpoint_paths import resolve_checkpoint_target

        return resolve_checkpoint_target(
            self.worker.config.checkpoint_dir, name, must_exist=must_exist
        )

    def shutdown(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None

    def dispatch(self, command: str, payload: Any) -> Any:
        """Runs one relayed command (name + positional args tuple)."""
        if command not in _COMMANDS:
            raise ValueError(f"unknown learner command {command!r}")
        return getattr(self, command)(*(payload or ()))


_COMMANDS = frozenset(
    {
        "train_step",
        "compute_logprobs",
        "full_weights",
        "publish_weights",
        "start_publish",
        "save_checkpoint",
        "save_train_state",
        "load_train_state",
        "shutdown",
    }
)
