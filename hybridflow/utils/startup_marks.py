"""Start-up phase marks: when each process of a job reached each step of its start.

Every process that deploy/launch.sh starts (and the launcher itself) calls
``mark(process, phase)`` at the points of its start: entered ``main``, imports done, model
built, serving. Each call appends one JSON line ``{"process", "phase", "time", "cpu_s",
"pid"}`` (``time``: ``time.time()``; ``cpu_s``: this process's CPU seconds so far) to the
file named by ``HYBRIDFLOW_STARTUP_LOG``, which the launcher sets to ``<run dir>/startup.jsonl``.
``mark_process_start`` adds the moment the kernel started the process (before the
interpreter), read from /proc. Unset, both do nothing: a service started by hand writes no
file. ``benchmarks/startup/phases.py`` prints the table (docs/benchmarks.md).

Standard library only, so a mark costs nothing measurable and can come first in ``main``.
"""

from __future__ import annotations

import json
import os
import time

ENV = "HYBRIDFLOW_STARTUP_LOG"
"""The file every process appends its marks to (unset: no marks)."""


def mark(process: str, phase: str, at: float | None = None, cpu_s: float | None = None) -> None:
    """Appends ``process`` reaching ``phase`` now (or at ``at``, a ``time.time()`` stamp) with
    this process's CPU seconds so far (or ``cpu_s``). A failed write is ignored: marks never
    stop a start."""
    path = os.environ.get(ENV)
    if not path:
        return
    record = {
        "process": process,
        "phase": phase,
        "time": time.time() if at is None else at,
        "cpu_s": time.process_time() if cpu_s is None else cpu_s,
        "pid": os.getpid(),
    }
    try:
        # One short line per write, opened in append mode: lines from several processes
        # do not interleave.
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
    except OSError:
        pass


def process_start_time(pid: int | None = None) -> float | None:
    """The ``time.time()`` at which the kernel started ``pid`` (default: this process), from
    /proc (Linux); None where it cannot be read."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # Relative to now through /proc/uptime (10 ms), not /proc/stat's btime (whole seconds).
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def mark_process_start(process: str) -> None:
    """Marks ``process_start`` (the kernel's start of this process, before the interpreter
    ran) and ``main`` (now), so the table shows interpreter start-up apart from the rest."""
    if not os.environ.get(ENV):
        return
    started = process_start_time()
    if started is not None:
        mark(process, "process_start", at=started, cpu_s=0.0)
    mark(process, "main")
