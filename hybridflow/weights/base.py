"""The weight-transport interface and its in-process implementation."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from hybridflow.types import WeightUpdateReport

if TYPE_CHECKING:
    import torch

NamedTensors = Iterable[tuple[str, "torch.Tensor"]]


class WeightSink(Protocol):
    """Anything that can take a full set of weights (a rollout engine)."""

    def load_weights(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> object: ...


class WeightSender(Protocol):
    """Delivers a full set of weights to one replica."""

    def send(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> WeightUpdateReport: ...

    def close(self) -> None: ...


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
