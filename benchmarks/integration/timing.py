"""Repeat-and-time helpers and the suite's detailed log (standard library only)."""

from __future__ import annotations

import datetime as dt
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class DetailedLog:
    """Timestamped lines, one per measured repeat; written as detailed.log."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, bench: str, what: str, seconds: float, **fields: Any) -> None:
        stamp = dt.datetime.now().isoformat(timespec="milliseconds")
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        self.lines.append(f"{stamp} [{bench}] {what:<22} {seconds * 1000:10.2f} ms  {extra}")

    def write(self, path: Path) -> None:
        path.write_text("\n".join(self.lines) + "\n")


def timed(
    fn: Callable[[], Any],
    repeats: int,
    warmup: int,
    log: DetailedLog,
    bench: str,
    what: str,
    fields: Callable[[Any], dict[str, Any]] | None = None,
) -> tuple[list[float], list[Any]]:
    """Calls ``fn`` warmup + repeats times; seconds and results of the timed calls."""
    for _ in range(warmup):
        fn()
    seconds, results = [], []
    for i in range(repeats):
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
        seconds.append(elapsed)
        results.append(result)
        log.add(bench, what, elapsed, repeat=i, **(fields(result) if fields else {}))
    return seconds, results


def stats(seconds: list[float]) -> dict[str, float]:
    """Median, min and max of repeated timings (median is the headline)."""
    return {
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "repeats": float(len(seconds)),
    }
