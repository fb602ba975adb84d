"""The stall rule (``coordinator/liveness.py``) on a fake clock and fake progress counts: an
answer is a sign of life when the replica holds no request or its engine moved since the last
answer; a replica that answers while its engine stands still on a request is stalled once
that lasted ``stall_timeout_s``, as is one that does not answer."""

from __future__ import annotations

from hybridflow.coordinator.liveness import Reading, StallWatch

BOUND = 20.0
STEP = BOUND / 4  # the probe interval probe_timing gives


def _watch() -> StallWatch:
    return StallWatch(BOUND, last_sign_of_life=0.0)


def busy(steps: int) -> Reading:
    return Reading(steps, busy=True)


def test_a_replica_that_steps_is_alive_at_every_probe() -> None:
    watch = _watch()
    for i in range(1, 100):
        watch.answered(i * STEP, busy(i))
        assert not watch.stalled(i * STEP)


def test_an_answering_replica_whose_engine_stands_still_is_stalled_at_the_bound() -> None:
    watch = _watch()
    verdicts = []
    for i in range(1, 6):
        assert not watch.answered(i * STEP, busy(7))  # answers; engine_steps stuck at 7
        verdicts.append(watch.stalled(i * STEP))
    # Silent since the request started (t=0): the first answer only set the mark to compare.
    assert verdicts == [False, False, False, True, True]
    assert "made no progress" in watch.verdict(4 * STEP)
    assert "engine_steps stuck at 7" in watch.verdict(4 * STEP)


def test_an_engine_that_wedges_mid_request_is_stalled_one_bound_after_its_last_step() -> None:
    watch = _watch()
    for i in range(1, 4):
        watch.answered(i * STEP, busy(10 * i))  # stepping until t=3*STEP
    wedged_at = 3 * STEP
    t = wedged_at
    while not watch.stalled(t):
        t += STEP
        watch.answered(t, busy(30))
    assert t == wedged_at + BOUND


def test_an_idle_answer_is_a_sign_of_life() -> None:
    """The request is on the wire (or its reply is): the replica holds none, waits on none."""
    watch = _watch()
    for i in range(1, 20):
        assert watch.answered(i * STEP, Reading(5, busy=False))
        assert not watch.stalled(i * STEP)


def test_a_request_queued_behind_a_stepping_one_is_alive() -> None:
    """The count is the replica's: another request stepping keeps this one's replica alive
    while this one waits for the engine."""
    watch = _watch()
    for i in range(1, 20):
        watch.answered(i * STEP, busy(100 + 3 * i))
        assert not watch.stalled(i * STEP)


def test_a_weight_apply_moves_the_count() -> None:
    """A request waiting while weights are applied: the apply's start and end count."""
    watch = _watch()
    watch.answered(STEP, busy(4))
    watch.answered(2 * STEP, busy(5))  # the apply started
    watch.answered(3 * STEP, busy(5))
    watch.answered(4 * STEP, busy(6))  # ... and ended
    assert not watch.stalled(4 * STEP) and watch.last_sign_of_life == 4 * STEP


def test_answers_without_a_reading_count_as_before() -> None:
    """A shed probe, or a replica that reports no progress (count 0, nothing held)."""
    watch = _watch()
    for i in range(1, 20):
        assert watch.answered(i * STEP, None)
        assert watch.answered(i * STEP + 1, Reading(0, busy=False))
    assert not watch.stalled(19 * STEP + 1)


def test_no_answer_is_silence_and_says_so() -> None:
    watch = _watch()
    watch.answered(STEP, busy(3))
    for _ in range(4):
        watch.unanswered()
    assert watch.stalled(BOUND) and not watch.stalled(BOUND - 0.1)
    assert watch.verdict(BOUND).startswith("stopped answering")


def test_stuck_then_silent_names_the_silence() -> None:
    watch = _watch()
    watch.answered(STEP, busy(3))
    watch.answered(2 * STEP, busy(3))
    watch.unanswered()
    assert watch.verdict(4 * STEP).startswith("stopped answering")
