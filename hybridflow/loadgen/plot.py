"""Draws a sweep: latency against achieved throughput, and achieved against offered load.

Imports matplotlib (Agg backend) only when called; knows nothing of how points were measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hybridflow.loadgen.stats import RunSummary


def plot_sweep(summaries: Sequence[RunSummary], target: str, address: str, path: str) -> None:
    """Writes a two-panel PNG; points with errors are circled in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [s for s in summaries if s.latency_ms is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    x = [s.requests_per_s for s in points]
    left.plot(x, [s.latency_ms.p50 for s in points if s.latency_ms], "o-", label="p50")
    left.plot(x, [s.latency_ms.p99 for s in points if s.latency_ms], "s--", label="p99")
    if target == "rollout":
        ttfr = [s.first_result_ms.p50 for s in points if s.first_result_ms]
        if len(ttfr) == len(points):
            left.plot(x, ttfr, "^:", label="time to first result p50")
    unit = "req/s" if points and points[0].mode == "open" else "in flight"
    for s in points:
        assert s.latency_ms is not None
        left.annotate(
            f"{s.load:g}",
            (s.requests_per_s, s.latency_ms.p99),
            fontsize=8,
            xytext=(3, 3),
            textcoords="offset points",
        )
        if s.num_errors:
            left.scatter(
                [s.requests_per_s], [s.latency_ms.p99], s=160, facecolors="none", edgecolors="red"
            )
    left.set_xlabel("achieved throughput (successful req/s)")
    left.set_ylabel("latency (ms)")
    left.set_yscale("log")
    left.set_title(f"{target} @ {address}: latency vs throughput (labels: load, {unit})")
    left.grid(True, which="both", alpha=0.3)
    left.legend()

    loads = [s.load for s in summaries]
    right.plot(loads, [s.requests_per_s for s in summaries], "o-", label="achieved req/s")
    if summaries and summaries[0].mode == "open":
        right.plot(loads, loads, ":", color="gray", label="offered (nominal)")
        right.plot(
            loads,
            [s.sent_per_s for s in summaries],
            "x",
            color="gray",
            label="sent (realized Poisson schedule)",
        )
        right.set_xlabel("offered rate (req/s)")
    else:
        right.set_xlabel("concurrency (requests in flight)")
    errors = [s for s in summaries if s.num_errors]
    if errors:
        right.scatter(
            [s.load for s in errors],
            [s.requests_per_s for s in errors],
            s=160,
            facecolors="none",
            edgecolors="red",
            label="errors",
        )
    right.set_ylabel("throughput (successful req/s)")
    right.set_title("throughput vs load")
    right.grid(True, alpha=0.3)
    right.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
