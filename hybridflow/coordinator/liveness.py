"""When a rollout replica counts as hung: the rule, pure (no threads, no I/O, no clock).

While a replica holds a request, its dispatcher probes it (``status`` with a short deadline)
every ``probe_interval_s``. A replica that shows no sign of life for ``stall_timeout_s`` is
stalled and leaves the dispatch set like a failed one. What is a sign of life:

- an answer from a replica that holds no request (``num_active_requests`` 0): the request is
  on the wire, either way, or its reply is; nothing of the engine is waited on;
- an answer from a replica that holds one, if its engine made progress since the last
  answer: ``engine_steps`` moved (a request entering or leaving the engine, a decode step, a
  weight receive or apply; ``services/rollout/local.py``). The first such answer of a
  request only sets the mark to compare with, so a replica wedged before the request came
  is out ``stall_timeout_s`` after the request started, not one probe later. The count is
  the replica's, not the request's: a request queued behind another one is alive while the
  other one steps;
- an answer that carries no progress (a replica that does not report it) or a probe shed
  because the replica is at its concurrency limit: as before, any answer.

So both are caught: a replica that stops answering (SIGSTOP, a wedged host or server), and
one whose server answers while its engine makes no progress (an engine thread blocked
forever). A single engine step or weight apply that outlasts ``stall_timeout_s`` (a long
prefill at real sizes, a very large weight load) reads as a stall too: the bound must
exceed the longest one (20 s by default).

The probe, not the Generate call, is the signal: a Generate stream says nothing until the
whole request is generated (its groups come at the end), so its silence grows with
max_new_tokens and the machine's speed, while a live replica answers the probe in
milliseconds whatever it is generating. A replica whose engine process died is failed at
once by its own watcher (``vllm_runtime``: probes answer UNAVAILABLE, the service exits for
the supervisor to restart it).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.errors import Unavailable

PROBE_TIMEOUT_S = 5.0
"""Deadline of one liveness probe. A live replica answers GetInfo in milliseconds,
generating or not; a hung one must not hold its caller for the channel's default (120 s)."""


class ReplicaStalled(Unavailable):
    """The replica showed no sign of life for ``coordinator.replica_stall_timeout_s``."""


def probe_timing(stall_timeout_s: float) -> tuple[float, float]:
    """(seconds between probes, deadline of one probe) for a stall bound: four probes fit in
    the bound, so one slow answer on a loaded host does not decide alone."""
    interval = stall_timeout_s / 4
    return interval, min(PROBE_TIMEOUT_S, interval)


@dataclass(frozen=True)
class Reading:
    """What an answered probe says of the engine."""

    engine_steps: int
    """The replica's progress count (``RolloutStatus.engine_steps``)."""
    busy: bool
    """It holds a request (``RolloutStatus.num_active_requests`` > 0)."""


@dataclass
class StallWatch:
    """Time since the replica's last sign of life, on the caller's clock."""

    stall_timeout_s: float
    last_sign_of_life: float
    """Clock reading of the last sign of life (the request's start before the first)."""
    last_steps: int | None = None
    """The progress count of the last answer (None before the first)."""
    stuck: bool = False
    """The last answer came from a replica holding a request whose engine had not moved."""

    def answered(self, now: float, reading: Reading | None = None) -> bool:
        """An answered probe (``reading`` None: it carried no progress count, or was shed);
        whether it was a sign of life."""
        if reading is None:
            alive = True
        else:
            moved = self.last_steps is not None and reading.engine_steps != self.last_steps
            self.last_steps = reading.engine_steps
            alive = moved or not reading.busy
        self.stuck = not alive
        if alive:
            self.last_sign_of_life = now
        return alive

    def unanswered(self) -> None:
        """A probe that failed or timed out: no sign of life."""
        self.stuck = False

    def silent_s(self, now: float) -> float:
        return now - self.last_sign_of_life

    def stalled(self, now: float) -> bool:
        return self.silent_s(now) >= self.stall_timeout_s

    def verdict(self, now: float) -> str:
        """Why the replica counts as stalled, for the log."""
        if self.stuck:
            return (
                "answers but its engine made no progress while holding a request "
                f"(engine_steps stuck at {self.last_steps}) for {self.silent_s(now):.0f}s"
            )
        return f"stopped answering: no answer to a liveness probe for {self.silent_s(now):.0f}s"
