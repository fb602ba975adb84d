"""Runs every point of a configuration (one run, or a sweep) against one service.

Glue only: opens the channel, prepares the target once, then for each point builds the
schedule, runs it and summarizes it. Points run one after another in the given order; a
point past saturation can leave the service busy for up to ``timeout_s``, so sweep upwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hybridflow.loadgen.config import LoadgenConfig
from hybridflow.loadgen.runner import run_closed_loop, run_open_loop
from hybridflow.loadgen.schedule import RunBounds, poisson_arrivals
from hybridflow.loadgen.stats import RunSummary, summarize
from hybridflow.loadgen.targets import make_target, open_channel


async def run_points(
    cfg: LoadgenConfig, on_point: Callable[[RunSummary], None] | None = None
) -> list[RunSummary]:
    """Runs ``cfg.points()`` in order; ``on_point`` sees each summary as soon as it exists."""
    cfg.validate()
    bounds = RunBounds(cfg.max_duration_s, cfg.max_requests)
    channel = open_channel(cfg.address)
    summaries: list[RunSummary] = []
    try:
        target = await make_target(cfg, channel)
        for mode, load in cfg.points():
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            if mode == "open":
                arrivals = poisson_arrivals(load, cfg.seed, bounds)
                records = await run_open_loop(target, arrivals, cfg.timeout_s)
            else:
                records = await run_closed_loop(target, int(load), bounds, cfg.timeout_s)
            if len(records) < cfg.max_requests:  # the duration bound ended sending
                send_end_s = cfg.max_duration_s
            else:
                send_end_s = max(r.sent_s for r in records)
            summary = summarize(records, mode, load, cfg.warmup_s, send_end_s)
            cpu_s = time.process_time() - cpu_start  # every thread, grpc's included
            summary.client_cpu_pct = 100.0 * cpu_s / (time.perf_counter() - wall_start)
            if on_point is not None:
                on_point(summary)
            summaries.append(summary)
    finally:
        await channel.close()
    return summaries
