"""Open and closed loops against fake async targets: bounds always end the run."""

import asyncio
import threading

import pytest

from hybridflow.loadgen import runner
from hybridflow.loadgen.runner import GUARD_S, Outcome, run_closed_loop, run_open_loop
from hybridflow.loadgen.schedule import RunBounds
from hybridflow.loadgen.stats import summarize


class InstantTarget:
    """Answers at once; remembers the indices it saw and the most calls in flight."""

    def __init__(self, code: str = "OK") -> None:
        self.code = code
        self.indices: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def call(self, index: int, timeout_s: float) -> Outcome:
        self.indices.append(index)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0)  # yield once, like a real call would
        self.in_flight -= 1
        return Outcome(self.code, num_items=2, num_output_tokens=5)


class SilentTarget:
    """Never answers."""

    async def call(self, index: int, timeout_s: float) -> Outcome:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_closed_loop_stops_at_the_request_bound():
    target = InstantTarget()
    records = asyncio.run(run_closed_loop(target, 4, RunBounds(3600.0, 50), timeout_s=1.0))
    assert len(records) == 50
    assert sorted(target.indices) == list(range(50))
    assert target.max_in_flight == 4
    assert all(r.code == "OK" and r.scheduled_s == r.sent_s <= r.end_s for r in records)


def test_closed_loop_stops_at_the_duration_bound():
    records = asyncio.run(
        run_closed_loop(InstantTarget(), 2, RunBounds(0.05, 10**6), timeout_s=1.0)
    )
    # Checked before each send: nothing goes out past the bound (plus generous jitter for a
    # loaded 2-core machine).
    assert records and all(r.sent_s < 1.0 for r in records)


def test_open_loop_sends_on_schedule_and_keeps_indices():
    arrivals = [0.01, 0.02, 0.02, 0.05]
    target = InstantTarget("UNAVAILABLE")
    records = asyncio.run(run_open_loop(target, arrivals, timeout_s=1.0))
    assert [r.scheduled_s for r in records] == arrivals
    assert target.indices == [0, 1, 2, 3]
    assert all(r.sent_s >= r.scheduled_s for r in records)
    summary = summarize(records, "open", 80.0, warmup_s=0.015)
    assert (summary.num_warmup, summary.num_sent, summary.errors) == (1, 3, {"UNAVAILABLE": 3})


def test_a_target_that_never_answers_still_ends_the_run_with_deadline_errors(monkeypatch):
    bounds: list[float] = []
    wait_for = asyncio.wait_for

    async def recording_wait_for(awaitable, timeout):
        # asyncio is one module for the whole process: only this test's own loop (the main
        # thread's) counts, not a library's background loop (the tinker SDK's heartbeat)
        if threading.current_thread() is threading.main_thread():
            bounds.append(timeout)
        return await wait_for(awaitable, timeout)

    monkeypatch.setattr(runner.asyncio, "wait_for", recording_wait_for)
    loop_records = asyncio.run(run_open_loop(SilentTarget(), [0.0, 0.001], timeout_s=0.05))
    closed_records = asyncio.run(
        run_closed_loop(SilentTarget(), 3, RunBounds(3600.0, 3), timeout_s=0.05)
    )
    for records in (loop_records, closed_records):
        assert {r.code for r in records} == {"DEADLINE_EXCEEDED"}
        assert all(r.end_s - r.sent_s >= 0.05 + GUARD_S - 1e-3 for r in records)
    # Every call is given up GUARD_S after its deadline (a real target's own deadline fires first).
    assert bounds == [0.05 + GUARD_S] * 5


def test_closed_loop_needs_a_worker():
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(run_closed_loop(InstantTarget(), 0, RunBounds(1.0, 1), timeout_s=1.0))
