"""In-process rollout replica: the engine plus bookkeeping. The servicer wraps exactly this,
so the in-process twin and the gRPC service behave the same.

Knows nothing of sockets or protos.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from hybridflow.types import Completion, RolloutStatus, SamplingParams, WeightUpdateReport

if TYPE_CHECKING:
    import torch

    from hybridflow.weights.dist import DistReceiver, GroupSpec


class Engine(Protocol):
    """What a generation engine offers (HFEngine; later vLLM)."""

    policy_version: int
    eos_token_id: int
    vocab_size: int

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def device(self) -> torch.device: ...

    def generate(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[list[Completion]]: ...

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> None: ...

    def check_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> object: ...

    between_steps: Callable[[], tuple[Sequence[tuple[str, torch.Tensor]], int] | None] | None


class LocalRollout:
    """One replica in this process: serialises generation, swaps weights between requests.

    New weights never wait for a request in flight: they are applied at once when the engine
    is idle, else staged and applied before the next request starts (in-flight requests
    finish on the weights they started with, so each completion has one policy version).
    """

    def __init__(
        self,
        engine: Engine,
        model: str,
        engine_name: str = "hf",
        in_flight_weights: str = "finish_old",
    ) -> None:
        """``in_flight_weights``: "finish_old" (requests in flight finish on the weights they
        started with) or "continue_new" (they switch between decode steps; per-token versions)."""
        if in_flight_weights not in ("finish_old", "continue_new"):
            raise ValueError(
                f"in_flight_weights must be finish_old or continue_new, got {in_flight_weights!r}"
            )
        self.engine = engine
        self.model = model
        self.engine_name = engine_name
        self._lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: tuple[Sequence[tuple[str, torch.Tensor]], int] | None = None
        self._num_requests = 0
        self._num_tokens = 0
        self._receiver: DistReceiver | None = None
        if in_flight_weights == "continue_new":
            engine.between_steps = self._take_pending

    def _take_pending(self) -> tuple[Sequence[tuple[str, torch.Tensor]], int] | None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        return pending

    def _apply_pending(self) -> None:
        """Caller holds ``_lock``."""
        pending = self._take_pending()
        if pending is not None:
            self.engine.load_weights(*pending)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, request_id: str = ""
    ) -> list[list[Completion]]:
        params.validate()
        with self._lock:
            self._apply_pending()
            groups = self.engine.generate([list(p) for p in prompts], params)
            self._num_requests += 1
            self._num_tokens += sum(len(c.token_ids) for g in groups for c in g)
        return groups

    def load_weights(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> WeightUpdateReport:
        start = time.perf_counter()
        self._check_weights(named_tensors)
        with self._pending_lock:
            self._pending = (named_tensors, policy_version)
        if self._lock.acquire(blocking=False):  # idle: swap now
            try:
                self._apply_pending()
            finally:
                self._lock.release()
        num_bytes = sum(t.numel() * t.element_size() for _, t in named_tensors)
        return WeightUpdateReport(policy_version, num_bytes, time.perf_counter() - start)

    def _check_weights(self, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Bad names or shapes fail the sender's call, not a later request."""
        self.engine.check_weights(named_tensors)

    @property
    def pending_version(self) -> int | None:
        with self._pending_lock:
            return self._pending[1] if self._pending is not None else None

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str:
        """Joins the learner's torch.distributed weight-sync group; returns the plan hash."""
        if self._receiver is None:
            from hybridflow.weights.dist import DistReceiver

            self._receiver = DistReceiver(self.engine.model, self.engine.device)
        return self._receiver.join(spec, replica_index)

    def receive_weights(self, policy_version: int) -> WeightUpdateReport:
        """Receives one sync over the group and stages it like ``load_weights``."""
        if self._receiver is None:
            raise ValueError("no weight-sync group: call JoinWeightSync first")
        start = time.perf_counter()
        tensors, num_bytes = self._receiver.receive()
        self.load_weights(tensors, policy_version)
        return WeightUpdateReport(policy_version, num_bytes, time.perf_counter() - start)

    def status(self) -> RolloutStatus:
        return RolloutStatus(
            model=self.model,
            engine=self.engine_name,
            policy_version=self.engine.policy_version,
            eos_token_id=self.engine.eos_token_id,
            vocab_size=self.engine.vocab_size,
            num_requests=self._num_requests,
            num_generated_tokens=self._num_tokens,
        )
