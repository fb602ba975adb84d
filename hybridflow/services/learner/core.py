"""What one learner rank does per command, the same on every rank of the SPMD group.

Rank 0's servicer relays each command to all ranks (``CommandRelay``), so collective work
(FSDP gathers inside ``full_state_dict_items``, checkpoint saves) happens everywhere while
only rank 0 talks to the outside (weight senders). Knows nothing of gRPC servers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hybridflow.types import TrainSample, TrainStepResult, WeightUpdateReport
from hybridflow.weights.base import WeightSender

if TYPE_CHECKING:
    import torch

    from hybridflow.services.learner.worker import LearnerWorker


class LearnerCore:
    def __init__(
        self,
        worker: LearnerWorker,
        rank: int = 0,
        sender_factory: Callable[[str], WeightSender] | None = None,
    ) -> None:
        self.worker = worker
        self.rank = rank
        self._sender_factory = sender_factory
        self._senders: dict[str, WeightSender] = {}

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
        """Gathers full weights (collective) and sends them to every target from rank 0."""
        start = time.perf_counter()
        items = self.full_weights()
        version = self.worker.policy_version
        num_bytes = 0
        if self.rank == 0:
            for target in targets:
                report = self._sender(target).send(items, version)
                num_bytes = report.num_bytes
        return WeightUpdateReport(version, num_bytes, time.perf_counter() - start)

    def save_checkpoint(self, path: str) -> str:
        self.worker.save_checkpoint(path)
        return path

    def shutdown(self) -> None:
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()

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
