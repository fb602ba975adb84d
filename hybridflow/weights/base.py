"""The weight-publishing interface and its whole-weights implementation.

A ``WeightPublisher`` gets the learner's current weights to a set of replicas; every learner
rank calls ``publish`` (it may be collective). Implementations, chosen from ``weight_sync``
by ``hybridflow.weights.publishers.make_publisher``:

- ``SendPublisher``: whole weights through one ``WeightSender`` per target, in-process
  (``LocalWeightSender``) or streamed over gRPC (``hybridflow.weights.client``);
- ``DistPublisher`` (``hybridflow.weights.dist_publisher``): each learner rank sends its
  FSDP shards over a torch.distributed group, each replica TP rank receives its slices.

A publisher knows nothing of models' internals or optimizers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from hybridflow.types import WeightUpdateReport

if TYPE_CHECKING:
    import numpy as np
    import torch

    from hybridflow.weights.spec import GroupSpec, ReplicaDescription

NamedTensors = Iterable[tuple[str, "torch.Tensor"]]
FullWeights = Callable[[], Sequence[tuple[str, "torch.Tensor"]]]
"""The full, unsharded weights (a collective under FSDP; rank 0 gets the tensors)."""


class WeightPublisher(Protocol):
    """Publishes the learner's current weights to replicas (called on every learner rank)."""

    def publish(self, targets: Sequence[str], version: int) -> WeightUpdateReport: ...

    def start(self, targets: Sequence[str], version: int) -> None:
        """Begins a publish; returns once the parameters may change again (the send may
        still be on its way: ``finish``)."""
        ...

    def finish(self) -> WeightUpdateReport:
        """Waits for the publish ``start`` began; its report once every target has it."""
        ...

    def retire(self, keep: Sequence[str]) -> None:
        """Lets go of what it holds for the replicas not in ``keep`` (before a publish to
        the whole serving set; a replica that left it is reached afresh if it comes back)."""
        ...

    def close(self) -> None: ...


class WeightSink(Protocol):
    """Anything that can take a full set of weights (a rollout replica in this process)."""

    def load_weights(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> object: ...


class WeightSender(Protocol):
    """Delivers a full set of weights to one replica."""

    def send(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> WeightUpdateReport: ...

    def close(self) -> None: ...


class ReplicaWeightClient(WeightSender, Protocol):
    """Everything a learner needs of one remote replica (``GrpcWeightSyncClient``)."""

    def tensor_parallel_size(self) -> int: ...

    def describe(self) -> ReplicaDescription: ...

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str: ...

    def receive_weights(self, policy_version: int, timeout_s: float) -> int: ...

    def probe_logprobs(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int], timeout_s: float
    ) -> tuple[np.ndarray, int]: ...


class LocalWeightSender:
    """In-process twin: hands tensors straight to an engine in the same process."""

    def __init__(self, sink: WeightSink) -> None:
        self._sink = sink

    def send(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> WeightUpdateReport:
        start = time.perf_counter()
        # Clone: the learner keeps updating its own parameters in place.
        copies = [(name, t.detach().clone()) for name, t in named_tensors]
        self._sink.load_weights(copies, policy_version)
        num_bytes = sum(t.numel() * t.element_size() for _, t in copies)
        return WeightUpdateReport(policy_version, num_bytes, time.perf_counter() - start)

    def close(self) -> None:
        pass


class SendPublisher:
    """Whole weights, gathered once per publish, sent by rank 0 to each target's sender."""

    def __init__(
        self,
        full_weights: FullWeights,
        rank: int = 0,
        sender_factory: Callable[[str], WeightSender] | None = None,
    ) -> None:
        self._full_weights = full_weights
        self._rank = rank
        self._sender_factory = sender_factory
        self._senders: dict[str, WeightSender] = {}
        self._last: WeightUpdateReport | None = None

    def attach(self, target: str, sender: WeightSender) -> None:
        """Use ``sender`` for ``target`` (e.g. an in-process replica)."""
        self._senders[target] = sender

    def publish(self, targets: Sequence[str], version: int) -> WeightUpdateReport:
        start = time.perf_counter()
        items = self._full_weights()  # every rank takes part in the gather
        num_bytes = 0
        if self._rank == 0:
            for target in targets:
                num_bytes = self._sender(target).send(items, version).num_bytes
        return WeightUpdateReport(version, num_bytes, time.perf_counter() - start)

    def start(self, targets: Sequence[str], version: int) -> None:
        """The whole publish, at once (the gather is a collective on the learner's group,
        which must not run beside a train step): ``finish`` only reports it."""
        self._last = self.publish(targets, version)

    def finish(self) -> WeightUpdateReport:
        if self._last is None:
            raise RuntimeError("no publish in flight: call start first")
        last, self._last = self._last, None
        return last

    def retire(self, keep: Sequence[str]) -> None:
        for target in [t for t in self._senders if t not in set(keep)]:
            self._senders.pop(target).close()

    def _sender(self, target: str) -> WeightSender:
        if target not in self._senders:
            if self._sender_factory is None:
                raise ValueError(f"no weight transport for target {target!r}")
            self._senders[target] = self._sender_factory(target)
        return self._senders[target]

    def close(self) -> None:
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()
