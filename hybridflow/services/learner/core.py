"""What one learner rank does per command, the same on every rank of the SPMD group.

Rank 0's servicer relays each command to all ranks (``CommandRelay``), so collective work
(FSDP gathers inside ``full_state_dict_items``, checkpoint saves) happens everywhere while
only rank 0 talks to the outside (weight senders). Knows nothing of gRPC servers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hybridflow.types import RolloutStatus, TrainSample, TrainStepResult, WeightUpdateReport
from hybridflow.weights.base import WeightSender
from hybridflow.weights.config import WeightSyncConfig


class WeightSyncReplica(Protocol):
    """How learner rank 0 reaches a replica for torch.distributed weight syncs."""

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str: ...

    def receive_weights(self, policy_version: int, timeout_s: float) -> int: ...

    def status(self) -> RolloutStatus: ...


if TYPE_CHECKING:
    import torch

    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.weights.dist import DistPublisher, GroupSpec


class LearnerCore:
    def __init__(
        self,
        worker: LearnerWorker,
        rank: int = 0,
        sender_factory: Callable[[str], WeightSender] | None = None,
        weight_sync: WeightSyncConfig | None = None,
        replica_factory: Callable[[str], WeightSyncReplica] | None = None,
    ) -> None:
        """``weight_sync.transport == "dist"`` publishes over a torch.distributed group
        (replicas reached through ``replica_factory``); otherwise through per-target senders."""
        self.worker = worker
        self.rank = rank
        self._sender_factory = sender_factory
        self._senders: dict[str, WeightSender] = {}
        self._weight_sync = weight_sync
        self._replica_factory = replica_factory
        self._replicas: dict[str, WeightSyncReplica] = {}
        self._dist: DistPublisher | None = None

    @property
    def policy_version(self) -> int:
        return self.worker.policy_version

    def attach_sender(self, target: str, sender: WeightSender) -> None:
        """Registers a transport for a target name (in-process twins use this)."""
        self._senders[target] = sender

    def train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        start = time.perf_counter()
        result = self.worker.train_step(samples)
        # Lets callers split their RPC time into compute and batch transfer.
        result.metrics["timing_s/learner_compute"] = time.perf_counter() - start
        return result

    def compute_logprobs(
        self, prompts: list[list[int]], responses: list[list[int]], temperature: float
    ) -> list[list[float]]:
        return self.worker.compute_logprobs(prompts, responses, temperature)

    def full_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Full, unsharded weights (a collective under FSDP; rank 0 gets the tensors)."""
        return list(self.worker.full_state_dict_items())

    def publish_weights(self, targets: Sequence[str]) -> WeightUpdateReport:
        """Sends the current weights to every target (a collective on every learner rank)."""
        if self._weight_sync is not None and self._weight_sync.transport == "dist":
            return self._publish_dist(targets)
        start = time.perf_counter()
        items = self.full_weights()
        version = self.worker.policy_version
        num_bytes = 0
        if self.rank == 0:
            for target in targets:
                report = self._sender(target).send(items, version)
                num_bytes = report.num_bytes
        return WeightUpdateReport(version, num_bytes, time.perf_counter() - start)

    def _publish_dist(self, targets: Sequence[str]) -> WeightUpdateReport:
        from hybridflow.weights.dist import DistPublisher

        cfg = self._weight_sync
        assert cfg is not None
        if self._dist is None:
            self._dist = DistPublisher(
                cfg, self.rank, self.worker.dist.world_size, self.worker.actor, self.worker.device
            )
        if self.rank != 0:
            return self._dist.publish(targets, self.worker.policy_version, None, None)
        return self._dist.publish(
            targets,
            self.worker.policy_version,
            lambda t, spec, i: self._replica(t).join_weight_sync(spec, i),
            lambda t, version: self._replica(t).receive_weights(version, cfg.timeout_s),
            lambda t: self._replica(t).status().tensor_parallel_size,
        )

    def _replica(self, target: str) -> WeightSyncReplica:
        if target not in self._replicas:
            if self._replica_factory is None:
                raise ValueError(f"no way to reach replica {target!r} for a weight sync")
            self._replicas[target] = self._replica_factory(target)
        return self._replicas[target]

    def save_checkpoint(self, path: str) -> str:
        self.worker.save_checkpoint(path)
        return path

    def shutdown(self) -> None:
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()
        if self._dist is not None:
            self._dist.close()
            self._dist = None

    def _sender(self, target: str) -> WeightSender:
        if target not in self._senders:
            if self._sender_factory is None:
                raise ValueError(f"no weight transport for target {target!r}")
            self._senders[target] = self._sender_factory(target)
        return self._senders[target]

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
        "save_checkpoint",
        "shutdown",
    }
)
