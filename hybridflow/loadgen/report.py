"""Turns run summaries into the printed table and the JSON report.

Pure formatting: knows nothing of how the numbers were measured. The JSON holds the resolved
config, the machine and library versions, and every run (one per sweep point).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from hybridflow.loadgen.stats import Distribution, RunSummary


def _ms(dist: Distribution | None, attr: str) -> str:
    return "-" if dist is None else f"{getattr(dist, attr):.1f}"


def format_table(summaries: Sequence[RunSummary], target: str) -> str:
    """One row per run: load, counts, sent and successful requests/s, latency percentiles,
    the generator's send lag and CPU share (% of one core), and errors by code."""
    rate_name = "tok/s" if target == "rollout" else "items/s"
    header = [
        "mode",
        "load",
        "sent",
        "ok",
        "err",
        "sent/s",
        "req/s",
        rate_name,
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "ttfr p50",
        "lag p99",
        "cpu%",
        "errors",
    ]
    rows = [header]
    for s in summaries:
        rate = s.output_tokens_per_s if target == "rollout" else s.items_per_s
        rows.append(
            [
                s.mode,
                f"{s.load:g}",
                str(s.num_sent),
                str(s.num_ok),
                str(s.num_errors),
                f"{s.sent_per_s:.2f}",
                f"{s.requests_per_s:.2f}",
                f"{rate:.1f}",
                _ms(s.latency_ms, "p50"),
                _ms(s.latency_ms, "p90"),
                _ms(s.latency_ms, "p99"),
                _ms(s.first_result_ms, "p50"),
                _ms(s.send_lag_ms, "p99"),
                "-" if s.client_cpu_pct is None else f"{s.client_cpu_pct:.0f}",
                " ".join(f"{code}={n}" for code, n in s.errors.items()) or "-",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, Any]:
    """The machine and the versions that produced the numbers."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "grpcio": _version("grpcio"),
        "hybridflow": _version("hybridflow"),
    }


def build_report(
    config: dict[str, Any], summaries: Sequence[RunSummary], env: dict[str, Any]
) -> dict[str, Any]:
    """The JSON document written by ``--out``."""
    return {
        "tool": "hybridflow-loadgen",
        "config": config,
        "environment": env,
        "runs": [dataclasses.asdict(s) for s in summaries],
    }
