"""The futures of the Tinker-compatible service: every call that does work is queued and
answered at once with a request id; one worker thread runs the queue; ``wait`` hands a result
back when it is there (docs/tinker-wire.md §2.4, §7).

Order: a model's operations run in its ``seq_id`` order (the SDK numbers them per training
client, from 1 after ``create_model``; the chunks of one ``forward_backward`` may arrive out of
order), so an operation waits until every lower ``seq_id`` of its model ran. Between models:
round-robin, one operation at a time, over the models whose next operation is there.
Operations of no model (``create_model``) run in arrival order, before the others; operations
of a key without ``seq_id``s (a sampling session's samples) run in arrival order, in the
round-robin like a model; when a sample's turn comes, the samples queued behind it and at the
head of the other sampling sessions' queues run with it as one batch (many tenants' samples
at once: each row with its own adapter).

Exactly once: an operation is keyed by its owner and ``(model_id, seq_id)`` and by the SDK's
``X-Idempotency-Key``; a retried POST gets the first request id back and runs nothing again.
Transport-free: knows nothing of HTTP or of what an operation does (``run`` is given).
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.errors import BadRequest, ResourceExhausted


class UserError(BadRequest):
    """The caller's mistake, reported in the future as ``category: user``."""


@dataclass
class Result:
    """A finished operation: a JSON object, or a protobuf body, or an error."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


@dataclass
class Operation:
    """One queued call: whose, what, for which model at which ``seq_id``; its result once
    ``done`` is set."""

    request_id: str
    owner: str
    kind: str
    payload: Any
    model_id: str | None = None
    seq_id: int | None = None
    idempotency_key: str | None = None
    """The SDK's idempotency key it came with."""
    result: Result | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Operations:
    """The queue, the worker and the results table. ``run(op)`` does an operation's work and
    returns its ``Result`` (a ``UserError`` it raises becomes an error result)."""

    def __init__(
        self,
        run: Callable[[Operation], Result],
        max_queued_per_model: int = 64,
        max_results: int = 4096,
        on_submit: Callable[[Operation], None] | None = None,
        on_done: Callable[[Operation], None] | None = None,
        start: bool = True,
        run_batch: Callable[[list[Operation]], list[Result]] | None = None,
        batch_kinds: frozenset[str] = frozenset(),
        max_batch: int = 64,
        max_queued_per_key: int = 1024,
    ) -> None:
        """``on_submit(op)`` runs before a new operation is queued (its failure refuses the
        submit) and ``on_done(op)`` before its result is told: the journal's hooks. With
        ``start`` False the worker waits for ``start()`` (recovery restores first).
        ``run_batch(ops)``: the results of operations of a kind in ``batch_kinds`` run
        together, up to ``max_batch``: those queued behind the one whose turn it is, under its
        key and then the other keys (the sampling sessions' samples)."""
        self._run = run
        self._run_batch = run_batch
        self.batch_kinds = batch_kinds
        self.max_batch = max_batch
        self.max_queued_per_key = max_queued_per_key
        """Operations waiting under a key without ``seq_id``s (a sampling session's)."""
        self._on_submit = on_submit
        self._on_done = on_done
        self.max_queued_per_model = max_queued_per_model
        self.max_results = max_results
        self._lock = threading.Condition()
        self._ops: OrderedDict[str, Operation] = OrderedDict()
        self._by_key: dict[tuple[str, str], str] = {}
        self._next_seq: dict[str, int] = {}
        self._waiting: dict[str, dict[int, Operation]] = {}
        self._unordered: deque[Operation] = deque()
        self._fifo: dict[str, deque[Operation]] = {}
        self._turn = itertools.count()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="tinker-operations", daemon=True)
        if start:
            self._worker.start()

    def start(self) -> None:
        self._worker.start()

    def restore(self, op: Operation, pending: bool) -> None:
        """Recovery: an operation accepted before a restart, queued again (``pending``) or
        finished with ``op.result``; its retries find it as before."""
        with self._lock:
            self._ops[op.request_id] = op
            for key in self._keys(op, op.idempotency_key):
                self._by_key[key] = op.request_id
            if not pending:
                op.done.set()
            elif op.seq_id is None:
                self._unordered.append(op)
            else:
                assert op.model_id is not None
                self._waiting.setdefault(op.model_id, {})[op.seq_id] = op
            self._lock.notify_all()

    def holding(self, fn: Callable[[set[str]], Any]) -> Any:
        """``fn(request ids still answered)``, with no operation submitted meanwhile (the
        journal's compaction: a submit journals its call under this lock)."""
        with self._lock:
            return fn(set(self._ops))

    def set_next_seq(self, model_id: str, next_seq: int) -> None:
        with self._lock:
            self._next_seq[model_id] = next_seq
            self._waiting.setdefault(model_id, {})

    def open_model(self, model_id: str, next_seq: int = 1) -> None:
        """Operations of ``model_id`` may queue from now; the first to run has ``next_seq``."""
        with self._lock:
            self._next_seq.setdefault(model_id, next_seq)
            self._waiting.setdefault(model_id, {})

    def submit(
        self,
        owner: str,
        kind: str,
        payload: Any,
        model_id: str | None = None,
        seq_id: int | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queues an operation and returns its request id, or the first request id of the
        same operation submitted before (nothing queued again)."""
        with self._lock:
            if self._closed:
                raise ResourceExhausted("the service is shutting down")
            op = Operation(
                uuid.uuid4().hex, owner, kind, payload, model_id, seq_id, idempotency_key
            )
            keys = self._keys(op, idempotency_key)
            for key in keys:
                if key in self._by_key:
                    return self._by_key[key]
            if seq_id is not None:
                assert model_id is not None
                if model_id not in self._next_seq:
                    raise UserError(f"no model {model_id!r}")
                if seq_id < self._next_seq[model_id]:
                    raise UserError(
                        f"seq_id {seq_id} of model {model_id!r} already ran (next: "
                        f"{self._next_seq[model_id]}) under another request"
                    )
                # a window, not a count: the operation that unblocks the others always fits
                last = self._next_seq[model_id] + self.max_queued_per_model - 1
                if seq_id > last:
                    raise ResourceExhausted(
                        f"seq_id {seq_id} of model {model_id!r} is beyond the queue's bound of "
                        f"{self.max_queued_per_model} operations (up to seq_id {last} now)"
                    )
            elif model_id is not None:
                waiting = len(self._fifo.get(model_id, ()))
                if waiting >= self.max_queued_per_key:
                    raise ResourceExhausted(
                        f"{waiting} calls already wait under {model_id!r}: at most "
                        f"{self.max_queued_per_key}; retry once some have finished"
                    )
            if self._on_submit is not None:
                self._on_submit(op)
            if seq_id is not None:
                assert model_id is not None
                self._waiting[model_id][seq_id] = op
            elif model_id is not None:
                self._fifo.setdefault(model_id, deque()).append(op)
            else:
                self._unordered.append(op)
            self._ops[op.request_id] = op
            for key in keys:
                self._by_key[key] = op.request_id
            self._forget_oldest()
            self._lock.notify_all()
            return op.request_id

    def wait(self, owner: str, request_id: str, timeout: float) -> Result | None:
        """The operation's result, or None if it has not finished within ``timeout``.
        KeyError: no such request for this owner (another owner's id is unknown here)."""
        with self._lock:
            op = self._ops.get(request_id)
            if op is None or op.owner != owner:
                raise KeyError(request_id)
        op.done.wait(timeout)
        return op.result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._worker.join(timeout=30)

    def _next_ops(self) -> list[Operation]:
        """The next operation; when its kind runs in batches, with the ones of its kind at
        the head of its key's queue and then of the other keys' queues. None ready: []."""
        if self._unordered:
            return [self._unordered.popleft()]
        ready = [m for m, w in self._waiting.items() if self._next_seq[m] in w]
        ready += [k for k, q in self._fifo.items() if q]
        if not ready:
            return []
        keys = sorted(ready)
        key = keys[next(self._turn) % len(keys)]
        if key in self._fifo and self._fifo[key]:
            ops = [self._fifo[key].popleft()]
            if self._run_batch is not None and ops[0].kind in self.batch_kinds:
                # this key's queue first, then the others' in turn: many samplers, one batch
                fifo = sorted(self._fifo)
                start = fifo.index(key)
                for other in fifo[start:] + fifo[:start]:
                    queue = self._fifo[other]
                    while queue and queue[0].kind == ops[0].kind and len(ops) < self.max_batch:
                        ops.append(queue.popleft())
            for emptied in [k for k, q in self._fifo.items() if not q]:
                del self._fifo[emptied]
            return ops
        op = self._waiting[key].pop(self._next_seq[key])
        self._next_seq[key] += 1
        return [op]

    def _work(self) -> None:
        while True:
            with self._lock:
                ops = self._next_ops()
                while not ops and not self._closed:
                    self._lock.wait()
                    ops = self._next_ops()
                if not ops:
                    return
            if len(ops) == 1:
                results = [self._result(self._run, ops[0])]
            else:
                batch = self._result(self._run_batch, ops)
                results = [batch] * len(ops) if isinstance(batch, Result) else batch
            for op, result in zip(ops, results, strict=True):
                op.result = result
                if self._on_done is not None:
                    try:
                        self._on_done(op)
                    except OSError as exc:
                        op.result = Result(
                            error=f"the result was not journaled: {exc}", category="server"
                        )
                op.done.set()

    @staticmethod
    def _result(run: Callable[[Any], Any] | None, arg: Any) -> Any:
        """``run(arg)``, or the error result of what it raised (the worker outlives it)."""
        assert run is not None
        try:
            return run(arg)
        except BadRequest as exc:  # UserError among them
            return Result(error=str(exc), category="user")
        except Exception as exc:
            return Result(error=f"{type(exc).__name__}: {exc}", category="server")

    @staticmethod
    def _keys(op: Operation, idempotency_key: str | None) -> list[tuple[str, str]]:
        keys = []
        if idempotency_key:
            keys.append((op.owner, f"idem:{idempotency_key}"))
        if op.model_id is not None and op.seq_id is not None:
            keys.append((op.owner, f"seq:{op.model_id}:{op.seq_id}"))
        return keys

    def _forget_oldest(self) -> None:
        """Drops the oldest finished operations beyond ``max_results`` (their ids then answer
        as unknown; the SDK reads that as an expired promise)."""
        excess = len(self._ops) - self.max_results
        if excess <= 0:
            return
        for request_id in [rid for rid, op in self._ops.items() if op.done.is_set()][:excess]:
            del self._ops[request_id]
        live = set(self._ops)
        self._by_key = {k: v for k, v in self._by_key.items() if v in live}
