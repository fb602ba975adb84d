"""Per-request records and their aggregation into one run's summary.

Pure: records carry times relative to the run start; nothing here reads a clock or knows
gRPC (an error is just its status-code name). Latency is measured from when a request was
*due* (its scheduled arrival in open loop), so a lagging generator cannot hide queueing
("coordinated omission"); ``send_lag_ms`` shows how late the generator itself was.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

OK = "OK"
"""Code of a successful request; anything else is an error code."""
BAD_RESPONSE = "BAD_RESPONSE"
"""Client-side code: the call succeeded but the reply had the wrong number of results."""


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request (times in seconds from the run start)."""

    scheduled_s: float
    """When it was due: the arrival (open loop) or the send (closed loop)."""
    sent_s: float
    """When the generator actually sent it."""
    end_s: float
    """When it finished, successfully or not."""
    code: str = OK
    """"OK", a gRPC status-code name (e.g. "UNAVAILABLE") or BAD_RESPONSE."""
    first_result_s: float | None = None
    """When the first streamed response arrived (rollout), else None."""
    num_output_tokens: int = 0
    """Generated tokens in the reply (rollout)."""
    num_items: int = 0
    """Completions (rollout) or scored items (reward) in the reply."""
    num_item_errors: int = 0
    """Items the service scored with an error (reward; not a gRPC error)."""


@dataclass(frozen=True)
class Distribution:
    """Summary of a sample of durations, in milliseconds."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass
class RunSummary:
    """One run (one point of a sweep), warm-up excluded."""

    mode: str
    """"open" (Poisson arrivals) or "closed" (fixed concurrency)."""
    load: float
    """Offered rate in requests/s (open) or the concurrency (closed)."""
    num_sent: int = 0
    """Requests sent after the warm-up."""
    num_warmup: int = 0
    """Requests sent during the warm-up (excluded from everything else)."""
    num_ok: int = 0
    num_errors: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    """Error count by code."""
    window_s: float = 0.0
    """From the end of the warm-up to the last completion."""
    sent_per_s: float = 0.0
    """Requests sent per second from the end of the warm-up to the end of sending: the
    offered load as realized (a Poisson schedule's count varies around rate x duration)."""
    requests_per_s: float = 0.0
    """Successful requests per second of the window."""
    output_tokens_per_s: float = 0.0
    items_per_s: float = 0.0
    """Completions (rollout) or scored items (reward) per second."""
    num_item_errors: int = 0
    latency_ms: Distribution | None = None
    """Of successful requests, from due time to completion."""
    first_result_ms: Distribution | None = None
    """Of successful streamed requests, from due time to the first response."""
    send_lag_ms: Distribution | None = None
    """How late the generator sent requests compared with their due time."""
    refused_ms: Distribution | None = None
    """Of requests refused by load shedding (RESOURCE_EXHAUSTED), from send to the refusal:
    how fast an overloaded service says no."""
    client_cpu_pct: float | None = None
    """CPU the generator process used over the whole run (warm-up included), in % of one
    core; set by the caller that owns the clock, None when not measured."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks.

    Same as ``numpy.percentile(values, q)`` (method "linear"): rank (n - 1) * q / 100.
    """
    if not values:
        raise ValueError("percentile of an empty sample")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution_ms(values_s: Sequence[float]) -> Distribution | None:
    """Mean, p50/p90/p99 and max of durations given in seconds, in ms (None when empty)."""
    if not values_s:
        return None
    ms = [v * 1000.0 for v in values_s]
    return Distribution(
        mean=sum(ms) / len(ms),
        p50=percentile(ms, 50),
        p90=percentile(ms, 90),
        p99=percentile(ms, 99),
        max=max(ms),
    )


def summarize(
    records: Sequence[RequestRecord],
    mode: str,
    load: float,
    warmup_s: float,
    send_end_s: float | None = None,
) -> RunSummary:
    """Aggregates the records of one run; those due before ``warmup_s`` are left out.

    ``send_end_s`` is when sending stopped (the duration bound, or the last send when the
    request bound ended the run); None takes the last send.
    """
    measured = [r for r in records if r.scheduled_s >= warmup_s]
    if send_end_s is None:
        send_end_s = max((r.sent_s for r in measured), default=warmup_s)
    send_window_s = send_end_s - warmup_s
    ok = [r for r in measured if r.code == OK]
    errors = Counter(r.code for r in measured if r.code != OK)
    window_s = max((r.end_s for r in measured), default=warmup_s) - warmup_s
    per_s = 1.0 / window_s if window_s > 0 else 0.0
    return RunSummary(
        mode=mode,
        load=load,
        num_sent=len(measured),
        num_warmup=len(records) - len(measured),
        num_ok=len(ok),
        num_errors=len(measured) - len(ok),
        errors=dict(sorted(errors.items())),
        window_s=window_s,
        sent_per_s=len(measured) / send_window_s if send_window_s > 0 else 0.0,
        requests_per_s=len(ok) * per_s,
        output_tokens_per_s=sum(r.num_output_tokens for r in ok) * per_s,
        items_per_s=sum(r.num_items for r in ok) * per_s,
        num_item_errors=sum(r.num_item_errors for r in ok),
        latency_ms=distribution_ms([r.end_s - r.scheduled_s for r in ok]),
        first_result_ms=distribution_ms(
            [r.first_result_s - r.scheduled_s for r in ok if r.first_result_s is not None]
        ),
        send_lag_ms=distribution_ms([r.sent_s - r.scheduled_s for r in measured]),
        refused_ms=distribution_ms(
            [r.end_s - r.sent_s for r in measured if r.code == "RESOURCE_EXHAUSTED"]
        ),
    )
