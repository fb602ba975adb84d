"""Drives a target with asyncio: open loop (Poisson arrivals) or closed loop (N in flight).

Knows nothing of gRPC: a target is anything with ``async call(index, timeout_s) -> Outcome``
that enforces ``timeout_s`` itself (gRPC deadlines do). Every call is also bounded here, a
little later (``GUARD_S``), so a target that never answers counts as DEADLINE_EXCEEDED
without racing the target's own deadline; and sending stops at the run's bounds, so a run
always ends by itself, after at most ``max_duration_s + timeout_s + GUARD_S``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from hybridflow.loadgen.schedule import RunBounds
from hybridflow.loadgen.stats import OK, RequestRecord

DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
GUARD_S = 0.25
"""The runner gives up on a call this long after its deadline (the target should have)."""


@dataclass(frozen=True)
class Outcome:
    """What a target reports for one call."""

    code: str = OK
    """"OK", a gRPC status-code name, or a client-side code such as BAD_RESPONSE."""
    first_result_at: float | None = None
    """``time.perf_counter()`` when the first streamed response arrived, if streamed."""
    num_output_tokens: int = 0
    num_items: int = 0
    num_item_errors: int = 0


class AsyncTarget(Protocol):
    """One service under load."""

    async def call(self, index: int, timeout_s: float) -> Outcome: ...


async def _one(
    target: AsyncTarget, index: int, scheduled_s: float | None, start: float, timeout_s: float
) -> RequestRecord:
    """One call; ``scheduled_s`` None means it is due when sent (closed loop)."""
    sent = time.perf_counter()
    try:
        outcome = await asyncio.wait_for(target.call(index, timeout_s), timeout_s + GUARD_S)
    except asyncio.TimeoutError:
        outcome = Outcome(DEADLINE_EXCEEDED)
    end = time.perf_counter()
    first = outcome.first_result_at
    return RequestRecord(
        scheduled_s=sent - start if scheduled_s is None else scheduled_s,
        sent_s=sent - start,
        end_s=end - start,
        code=outcome.code,
        first_result_s=None if first is None else first - start,
        num_output_tokens=outcome.num_output_tokens,
        num_items=outcome.num_items,
        num_item_errors=outcome.num_item_errors,
    )


async def run_open_loop(
    target: AsyncTarget, arrivals: Iterable[float], timeout_s: float
) -> list[RequestRecord]:
    """Sends request i at ``arrivals[i]`` seconds from now whatever is still in flight.

    ``arrivals`` must already respect the run's bounds (``poisson_arrivals`` does).
    """
    start = time.perf_counter()
    tasks: list[asyncio.Task[RequestRecord]] = []
    for index, due in enumerate(arrivals):
        delay = start + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(target, index, due, start, timeout_s)))
    return list(await asyncio.gather(*tasks))


async def run_closed_loop(
    target: AsyncTarget, concurrency: int, bounds: RunBounds, timeout_s: float
) -> list[RequestRecord]:
    """``concurrency`` workers each send their next request as soon as the last one ends."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    start = time.perf_counter()
    counter = itertools.count()
    records: list[RequestRecord] = []

    async def worker() -> None:
        while True:
            index = next(counter)
            if bounds.exhausted(time.perf_counter() - start, index):
                return
            records.append(await _one(target, index, None, start, timeout_s))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records
