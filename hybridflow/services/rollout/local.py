"""In-process rollout replica: the engine plus bookkeeping. The servicer wraps exactly this,
so the in-process twin and the gRPC service behave the same.

Knows nothing of sockets or protos.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hybridflow.arrays import FloatArray, TokenLike, as_tokens
from hybridflow.errors import FailedPrecondition, Unavailable
from hybridflow.services.rollout.engine_contract import Engine, StagedWeights
from hybridflow.services.rollout.requests import Cancelled, ShouldStop
from hybridflow.types import Completion, RolloutStatus, SamplingParams, WeightUpdateReport

log = logging.getLogger(__name__)

MAX_POLICY_VERSION = 2**31 - 1
"""Largest policy version a replica takes: completions carry it as an int32."""

if TYPE_CHECKING:
    import torch

    from hybridflow.resharding.layout import ReplicaLayout
    from hybridflow.weights.spec import GroupSpec


class LocalRollout:
    """One replica in this process: serialises generation, swaps weights between requests.

    New weights never wait for a request in flight: they are applied at once when the engine
    is idle, else staged and applied before the next request starts (in-flight requests
    finish on the weights they started with, so each completion has one policy version).

    Its status reports engine progress for the coordinator's liveness rule
    (``coordinator.liveness``): ``engine_steps`` rises when a request enters or leaves the
    engine, at every decode step (the engine polls its stop flag there, which this class
    counts; so every engine that keeps the contract is counted, none has to report it) and
    around every weight receive and apply; ``num_active_requests`` counts the requests held.
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
        self._pending: tuple[StagedWeights, int] | None = None
        self._num_requests = 0
        self._num_tokens = 0
        self._progress_lock = threading.Lock()
        self._engine_steps = 0
        self._num_active = 0
        self.num_cancelled = 0
        """Requests ended early because their caller went away."""
        self.last_cancelled_steps: int | None = None
        """Decode steps the last cancelled request had run before it stopped."""
        if in_flight_weights == "continue_new":
            engine.between_steps = self._take_pending

    def _step(self) -> None:
        """The engine made progress (``engine_steps``)."""
        with self._progress_lock:
            self._engine_steps += 1

    def _held(self, delta: int) -> None:
        with self._progress_lock:
            self._num_active += delta

    def _take_pending(self) -> tuple[StagedWeights, int] | None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._step()  # between decode steps the engine applies them next
        return pending

    def _apply_pending(self) -> None:
        """Caller holds ``_lock``."""
        pending = self._take_pending()
        if pending is not None:
            self.engine.load_weights(*pending)
            self._step()

    def generate(
        self,
        prompts: Sequence[TokenLike],
        params: SamplingParams,
        request_id: str = "",
        should_stop: ShouldStop | None = None,
    ) -> list[list[Completion]]:
        """Runs one request; ``Cancelled`` when ``should_stop`` turns true before it is done
        (while it waited for the engine or between decode steps)."""
        params.validate()

        def polled() -> bool:  # before every decode step: one step of progress
            self._step()
            return should_stop is not None and should_stop()

        self._held(1)
        try:
            with self._lock:
                self._apply_pending()
                try:
                    if should_stop is not None and should_stop():
                        raise Cancelled(0)  # its caller left while it queued
                    self._step()
                    groups = self.engine.generate([as_tokens(p) for p in prompts], params, polled)
                except Cancelled as exc:
                    self.num_cancelled += 1
                    self.last_cancelled_steps = exc.num_steps
                    raise
                finally:
                    self._step()
                self._num_requests += 1
                self._num_tokens += sum(len(c.token_ids) for g in groups for c in g)
        finally:
            self._held(-1)
        return groups

    def load_weights(self, named_tensors: StagedWeights, policy_version: int) -> WeightUpdateReport:
        """Stage weights (None: what the engine's receiver staged) and apply them at once
        when idle, else before the next request (or decode step, with continue_new)."""
        start = time.perf_counter()
        if not 0 <= policy_version <= MAX_POLICY_VERSION:
            raise ValueError(
                f"policy_version {policy_version} outside [0, {MAX_POLICY_VERSION}] (an int32 "
                "on every completion)"
            )
        if named_tensors is not None:
            self._check_weights(named_tensors)
        with self._pending_lock:
            current = max(self.engine.policy_version, self._pending[1] if self._pending else 0)
            if policy_version < current:
                raise FailedPrecondition(
                    f"policy_version {policy_version} is older than this replica's "
                    f"{current}; weight versions never go backwards"
                )
            self._pending = (named_tensors, policy_version)
        if self._lock.acquire(blocking=False):  # idle: swap now
            try:
                self._apply_pending()
            finally:
                self._lock.release()
        num_bytes = sum(t.numel() * t.element_size() for _, t in named_tensors or ())
        return WeightUpdateReport(policy_version, num_bytes, time.perf_counter() - start)

    def _check_weights(self, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Bad names, shapes or values fail the sender's call, not a later request (nothing
        is staged or applied unless every tensor passes)."""
        self.engine.check_weights(named_tensors)
        import torch

        for name, tensor in named_tensors:
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                bad = int((~torch.isfinite(tensor)).sum())
                raise ValueError(
                    f"load_weights: tensor {name!r} has {bad} non-finite values (NaN/Inf)"
                )

    def probe_logprobs(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> tuple[FloatArray, int]:
        """The delivery probe (``weights/verify.py``): log-probs of ``response_ids`` under the
        weights served once every received update is applied (after the request in flight),
        and their version."""
        with self._lock:
            self._apply_pending()
            return self.engine.probe_logprobs(prompt_ids, response_ids), self.engine.policy_version

    @property
    def tensor_parallel_size(self) -> int:
        return self.engine.tensor_parallel_size

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    @property
    def pending_version(self) -> int | None:
        with self._pending_lock:
            return self._pending[1] if self._pending is not None else None

    def weight_layout(self) -> ReplicaLayout:
        """How the engine places the learner's parameters (reported at weight-sync join)."""
        return self.engine.weight_layout()

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str:
        """Joins the learner's torch.distributed weight-sync group; returns the plan hash."""
        return self.engine.join_weight_sync(spec, replica_index)

    def receive_weights(self, policy_version: int) -> WeightUpdateReport:
        """Receives one sync over the group and stages it like ``load_weights``."""
        start = time.perf_counter()
        self._step()
        staged, num_bytes = self.engine.receive_weights()
        self._step()
        received = time.perf_counter()
        self.load_weights(staged, policy_version)
        done = time.perf_counter()
        log.info(
            "weights v%d: received %d bytes in %.4f s, staged/applied in %.4f s",
            policy_version,
            num_bytes,
            received - start,
            done - received,
        )
        return WeightUpdateReport(policy_version, num_bytes, done - start)

    def status(self, timeout_s: float | None = None) -> RolloutStatus:
        """``timeout_s`` is for the RolloutClient protocol: nothing here waits. An engine
        that died (``dead_reason``) is Unavailable: a liveness probe must not find it alive."""
        dead_reason = self.engine.dead_reason
        if dead_reason is not None:
            raise Unavailable(dead_reason)
        with self._progress_lock:
            engine_steps, num_active = self._engine_steps, self._num_active
        return RolloutStatus(
            model=self.model,
            engine=self.engine_name,
            policy_version=self.engine.policy_version,
            eos_token_id=self.engine.eos_token_id,
            vocab_size=self.engine.vocab_size,
            num_requests=self._num_requests,
            num_generated_tokens=self._num_tokens,
            tensor_parallel_size=self.engine.tensor_parallel_size,
            engine_steps=engine_steps,
            num_active_requests=num_active,
        )
