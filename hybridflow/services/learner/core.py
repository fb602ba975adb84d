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

import numpy as np

from hybridflow.arrays import FloatArray, TokenLike
from hybridflow.types import LearnerNeeds, TrainSample, TrainStepResult, WeightUpdateReport
from hybridflow.weights.base import ReplicaWeightClient, WeightPublisher
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.verify import Probe, ProbeFn, VerifiedPublisher

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
        probe_replica: ProbeFn | None = None,
    ) -> None:
        """Weights go out through ``publisher``, or one ``make_publisher`` builds from
        ``weight_sync`` on first use (replicas reached through ``client_factory``). A LoRA
        learner publishes its adapters only. Syncs are verified (``weights/verify.py``) with
        LoRA or ``weight_sync.verify``: replicas' probes through ``probe_replica``, else
        through ``client_factory``'s clients."""
        self.worker = worker
        self.rank = rank
        self._weight_sync = weight_sync
        self._client_factory = client_factory
        self._publisher = publisher
        self._probe_replica = probe_replica
        self._probe_clients: dict[str, ReplicaWeightClient] = {}
        self._verifying = False
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

    def publish_weights(self, targets: Sequence[str], catch_up: bool = False) -> WeightUpdateReport:
        """Sends the current weights to every target (a collective on every rank that holds
        the actor: the sources; critic ranks of a split learner take no part). ``targets``
        are the whole serving set (the publisher lets go of the replicas it no longer
        names), or with ``catch_up`` replicas joining or coming back, the others untouched."""
        if not self.worker.has_actor:
            return WeightUpdateReport(self.worker.policy_version, 0, 0.0)
        publisher = self._get_publisher()
        if not catch_up:
            publisher.retire(targets)
        return publisher.publish(targets, self.worker.policy_version)

    def start_publish(self, targets: Sequence[str], keep: Sequence[str] | None = None) -> int:
        """Begins a publish of the current weights (every rank, relayed like
        ``publish_weights``) and returns its version once the next ``train_step`` may run:
        each rank has copied its shards, and their send runs beside it (the ``dist``
        transport; ``grpc`` sends at once). ``finish_publish`` reports it. ``targets`` are
        the whole serving set, unless ``keep`` names more replicas to hold on to (ones that
        joined after the targets were read)."""
        version = self.worker.policy_version
        if self.worker.has_actor:
            publisher = self._get_publisher()
            publisher.retire(keep if keep is not None else targets)
            publisher.start(targets, version)
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
        worker = self.worker
        if self._publisher is None:
            from hybridflow.weights.publishers import make_publisher

            role = worker.role
            lora = worker.adapters is not None
            self._publisher = make_publisher(
                self._weight_sync,
                rank=role.group_rank,
                world_size=role.group_size,
                module=worker.adapters if worker.adapters is not None else worker.actor,
                device=worker.device,
                full_weights=worker.adapter_items if lora else self.full_weights,
                client_factory=self._client_factory,
                group=role.group,
                whole=lora,
            )
        config = self._weight_sync
        verify = worker.adapters is not None or (config is not None and config.verify)
        if verify and not self._verifying:
            self._publisher = VerifiedPublisher(
                self._publisher,
                Probe.for_vocab(worker.vocab_size),
                lambda prompt, response: worker.compute_logprobs([prompt], [response], 1.0)[0],
                self._probe_replica or self._probe_through_clients,
                config.verify_tolerance if config is not None else 1e-4,
                worker.role.group_rank,
            )
            self._verifying = True
        return self._publisher

    def _probe_through_clients(
        self, target: str, prompt: Sequence[int], response: Sequence[int]
    ) -> tuple[np.ndarray, int]:
        if self._client_factory is None:
            raise ValueError(f"no way to reach replica {target!r} for the delivery probe")
        client = self._probe_clients.get(target)
        if client is None:
            client = self._probe_clients[target] = self._client_factory(target)
        timeout_s = self._weight_sync.timeout_s if self._weight_sync is not None else 60.0
        return client.probe_logprobs(prompt, response, timeout_s)

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
            self._verifying = False
        for client in self._probe_clients.values():
            client.close()
        self._probe_clients.clear()

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
