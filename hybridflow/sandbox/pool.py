"""A pool of sandbox slots: at most ``workers`` programs run at once, each slot on its own
``Sandbox`` (for bubblewrap: its own host uid, so the per-uid process limit of one slot's
program is not spent by another's fork bomb), and at most ``max_queued`` programs wait.

A program past its limits costs its own wall time, never a slot: the sandbox kills it at its
deadline and the slot takes the next one. A submit beyond the queue's bound is refused at
once (``PoolFull``), never left to wait without bound. ``close`` refuses new work and waits
for the programs running (each ends by its own deadline).

The pool lives in the process that needs programs run (the reward service for the code
scorer, the environment service for the ``python`` tool): each run is already a process tree
of its own, in its own namespaces, so a separate service would add a hop and one more process
holding a token, not isolation (docs/sandbox.md). This module knows nothing of what the
programs are for.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from hybridflow.sandbox.types import Sandbox, SandboxLimits, SandboxResult

POOL_UID_BASE = 1_000_000_000
"""Under a root caller, slot ``i`` of the pool of process ``pid`` runs its programs as host
uid ``POOL_UID_BASE + (pid % 2**22) * MAX_WORKERS + i`` (``slot_uid``): no account has these,
two pools on one machine (the reward and the environment service) do not share one, and all
stay below the 2**31 bwrap takes."""
MAX_WORKERS = 256
"""Most slots one pool may have."""
LATENCY_WINDOW = 10_000
"""Runs the latency percentiles of ``stats`` are taken over (the latest)."""


class PoolFull(RuntimeError):
    """More programs wait than the pool's ``max_queued``: this one was not run."""


class PoolClosed(RuntimeError):
    """The pool was closed: this program was not run."""


@dataclass(frozen=True)
class PoolStats:
    """What the pool did so far (``stats``)."""

    workers: int
    num_runs: int
    """Programs that ran to an outcome."""
    num_refused: int
    """Submits refused because the queue was full."""
    outcomes: dict[str, int]
    """Runs by ``SandboxResult.outcome``."""
    num_running: int
    num_queued: int
    run_p50_s: float
    run_p99_s: float
    """Wall time of a run (its sandbox's start to its end), over the latest runs."""
    wait_p50_s: float
    wait_p99_s: float
    """Time a program waited for a slot, over the latest runs."""


@dataclass
class _Job:
    argv: list[str]
    files: Mapping[str, str | bytes]
    limits: SandboxLimits
    stdin: bytes
    future: Future[SandboxResult]
    queued_at: float


class SandboxPool:
    """``workers`` slots that run sandboxed programs (module docstring); thread-safe."""

    def __init__(
        self,
        make_sandbox: Callable[[int], Sandbox],
        workers: int,
        max_queued: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``make_sandbox(slot)``: slot ``slot``'s sandbox, made here, so a machine that
        cannot sandbox fails now (``SandboxUnavailable``) and nothing runs unsandboxed."""
        if not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be in 1..{MAX_WORKERS}, got {workers}")
        if max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, got {max_queued}")
        self.workers = workers
        self.max_queued = max_queued
        self._clock = clock
        self._sandboxes = [make_sandbox(slot) for slot in range(workers)]
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._num_queued = 0
        self._num_running = 0
        self._num_refused = 0
        self._outcomes: Counter[str] = Counter()
        self._run_s: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._wait_s: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._threads = [
            threading.Thread(target=self._serve, args=(s,), name=f"sandbox-{i}", daemon=True)
            for i, s in enumerate(self._sandboxes)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self,
        argv: list[str],
        files: Mapping[str, str | bytes],
        limits: SandboxLimits,
        stdin: bytes = b"",
    ) -> Future[SandboxResult]:
        """Queues one program; its future holds the ``SandboxResult``. ``PoolFull`` when
        ``max_queued`` programs already wait for a slot; ``PoolClosed`` after ``close``."""
        future: Future[SandboxResult] = Future()
        with self._lock:
            if self._closed:
                raise PoolClosed("the sandbox pool is closed")
            waiting = self._num_queued + self._num_running - self.workers
            if waiting >= self.max_queued:
                self._num_refused += 1
                raise PoolFull(
                    f"{self._num_queued} programs wait for the sandbox pool's {self.workers} "
                    f"slots, its bound is max_queued={self.max_queued}"
                )
            self._num_queued += 1
        self._jobs.put(_Job(list(argv), dict(files), limits, stdin, future, self._clock()))
        return future

    def run(
        self,
        argv: list[str],
        files: Mapping[str, str | bytes],
        limits: SandboxLimits,
        stdin: bytes = b"",
    ) -> SandboxResult:
        """``submit`` and wait for the result."""
        return self.submit(argv, files, limits, stdin).result()

    def _serve(self, sandbox: Sandbox) -> None:
        while (job := self._jobs.get()) is not None:
            started = self._clock()
            with self._lock:
                self._num_queued -= 1
                self._num_running += 1
            if not job.future.set_running_or_notify_cancel():
                with self._lock:
                    self._num_running -= 1
                continue
            try:
                result = sandbox.run(job.argv, job.files, job.limits, job.stdin)
            except BaseException as exc:  # noqa: BLE001 — the caller's, through its future
                with self._lock:
                    self._num_running -= 1
                job.future.set_exception(exc)
                continue
            with self._lock:
                self._num_running -= 1
                self._outcomes[result.outcome] += 1
                self._run_s.append(self._clock() - started)
                self._wait_s.append(started - job.queued_at)
            job.future.set_result(result)

    def stats(self) -> PoolStats:
        with self._lock:
            runs, waits = sorted(self._run_s), sorted(self._wait_s)
            return PoolStats(
                workers=self.workers,
                num_runs=sum(self._outcomes.values()),
                num_refused=self._num_refused,
                outcomes=dict(self._outcomes),
                num_running=self._num_running,
                num_queued=self._num_queued,
                run_p50_s=percentile(runs, 0.5),
                run_p99_s=percentile(runs, 0.99),
                wait_p50_s=percentile(waits, 0.5),
                wait_p99_s=percentile(waits, 0.99),
            )

    def close(self) -> None:
        """Refuses new programs, cancels the queued ones, waits for the running ones (each
        ends by its own deadline); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                with self._lock:
                    self._num_queued -= 1
                if job.future.cancel():
                    continue
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank); 0.0 for none."""
    if not ordered:
        return 0.0
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def slot_uid(slot: int, pid: int | None = None) -> int:
    """The host uid of ``slot`` in this process's pool (``POOL_UID_BASE``)."""
    if not 0 <= slot < MAX_WORKERS:
        raise ValueError(f"slot must be in 0..{MAX_WORKERS - 1}, got {slot}")
    pid = os.getpid() if pid is None else pid
    return POOL_UID_BASE + (pid % 2**22) * MAX_WORKERS + slot
