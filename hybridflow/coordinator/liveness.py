"""When a rollout replica counts as hung: the rule, pure (no threads, no I/O, no clock).

While a replica holds a request, its dispatcher probes it (``status`` with a short deadline)
every ``probe_interval_s``. An answer, or a probe shed because the replica is at its
concurrency limit, is a sign of life; a replica that shows none for ``stall_timeout_s`` is
stalled (SIGSTOP, a wedged host or server) and leaves the dispatch set like a failed one.

The probe, not the Generate call, is the signal: a Generate stream says nothing until the
whole request is generated (its groups come at the end), so its silence grows with
max_new_tokens and the machine's speed, while a live replica answers the probe in
milliseconds whatever it is generating. A replica whose server answers while its engine is
wedged is not caught here; its engine's own watcher (``vllm_engine``) or the call's
deadline (``coordinator.channel.timeout_s``) is.
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


@dataclass
class StallWatch:
    """Time since the replica's last sign of life, on the caller's clock."""

    stall_timeout_s: float
    last_sign_of_life: float
    """Clock reading of the last answer (the request's start before the first)."""

    def answered(self, now: float) -> None:
        self.last_sign_of_life = now

    def silent_s(self, now: float) -> float:
        return now - self.last_sign_of_life

    def stalled(self, now: float) -> bool:
        return self.silent_s(now) >= self.stall_timeout_s
