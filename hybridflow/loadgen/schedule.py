"""When requests are sent: a seeded Poisson arrival schedule and the run's stopping bounds.

Pure: no clocks, no sockets. The runner asks ``RunBounds.exhausted`` before every send and
iterates ``poisson_arrivals`` lazily, so a run ends at whichever bound comes first.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RunBounds:
    """When a run stops sending (both are always finite)."""

    max_duration_s: float
    """No request is sent at or after this many seconds from the start."""
    max_requests: int
    """No more than this many requests are sent."""

    def __post_init__(self) -> None:
        if not 0.0 < self.max_duration_s < float("inf"):
            raise ValueError(f"max_duration_s must be finite and > 0, got {self.max_duration_s}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")

    def exhausted(self, elapsed_s: float, num_sent: int) -> bool:
        """True once no further request may be sent."""
        return elapsed_s >= self.max_duration_s or num_sent >= self.max_requests


def poisson_arrivals(rate: float, seed: int, bounds: RunBounds) -> Iterator[float]:
    """Arrival times (s from the start) of a Poisson process at ``rate`` requests/s.

    Gaps are i.i.d. exponential with mean 1/rate, drawn from ``random.Random(seed)``; the
    first arrival comes one gap after 0. Stops before ``bounds.max_duration_s`` or after
    ``bounds.max_requests`` arrivals, whichever comes first.
    """
    if not rate > 0.0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(seed)
    t = 0.0
    for num_sent in range(bounds.max_requests):
        t += rng.expovariate(rate)
        if bounds.exhausted(t, num_sent):
            return
        yield t
