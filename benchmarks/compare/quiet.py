"""Is the machine quiet enough to time on? The CPU other processes use over a short window,
and the busiest of them, read from /proc (Linux; elsewhere nothing is said)."""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_CORES = 0.25
"""Cores in use by others above which a timing run is worth a warning."""


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def process_jiffies() -> dict[int, tuple[str, int]]:
    """{pid: (command name, user + system ticks)} of every process readable now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = (name, int(rest[11]) + int(rest[12]))
    return found


def busy_report(window_s: float = 2.0) -> str:
    """'' when the others use under ``BUSY_CORES``; else how much and who, e.g.
    ``1.6 of 2 cores busy: python3 (pid 812) 0.9, make (pid 80) 0.5``."""
    if not Path("/proc/stat").exists():
        return ""
    busy0, total0 = cpu_jiffies()
    procs0 = process_jiffies()
    time.sleep(window_s)
    busy1, total1 = cpu_jiffies()
    procs1 = process_jiffies()
    cores = os.cpu_count() or 1
    in_use = cores * (busy1 - busy0) / max(1, total1 - total0)
    if in_use < BUSY_CORES:
        return ""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    users = sorted(
        (
            (ticks - procs0[pid][1]) / ticks_per_s / window_s,
            f"{name} (pid {pid})",
        )
        for pid, (name, ticks) in procs1.items()
        if pid in procs0 and pid != me
    )[::-1][:3]
    who = ", ".join(f"{label} {share:.1f}" for share, label in users if share >= 0.05)
    return f"{in_use:.1f} of {cores} cores busy" + (f": {who}" if who else "")
