"""Helpers for fault tests: launch deploy/launch.sh, find the run's processes, check they end.

Processes are identified by pid and start time (/proc/PID/stat), so a reused pid never counts
as a survivor; zombies (dead, not yet reaped) count as gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hybridflow.coordinator.metrics import read_step_lines
from hybridflow.deploy.lifeline import is_alive, process_start_ticks

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "deploy" / "launch.sh"


def launch(output: Path, *args: str) -> subprocess.Popen[bytes]:
    """deploy/launch.sh with ``args``, its output to the file ``output`` (a pipe nobody reads
    would fill and block it); its pid is the launcher's (launch.sh execs it)."""
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env.pop("HYBRIDFLOW_TOKEN", None)
    with output.open("wb") as out:
        return subprocess.Popen(
            [str(LAUNCH), *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_args(run_dir: Path, *overrides: str) -> list[str]:
    args = ["--run-dir", str(run_dir)]
    for o in overrides:
        args += ["--set", o]
    return args


def tree(pid: int) -> dict[int, tuple[int | None, str]]:
    """``pid`` and its live descendants: pid -> (start ticks, command line)."""
    out: dict[int, tuple[int | None, str]] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        start = process_start_ticks(current)
        if start is None:
            continue
        try:
            cmdline = Path(f"/proc/{current}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:  # the process is gone
            continue
        out[current] = (start, cmdline)
        for task in tasks:
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:  # that thread ended meanwhile: its siblings still count
                continue
    return out


def find(procs: dict[int, tuple[int | None, str]], needle: str) -> int:
    pids = [pid for pid, (_, cmd) in procs.items() if needle in cmd]
    assert len(pids) == 1, (needle, procs)
    return pids[0]


def survivors(procs: dict[int, tuple[int | None, str]]) -> dict[int, str]:
    return {pid: cmd for pid, (start, cmd) in procs.items() if is_alive(pid, start)}


def wait_all_gone(procs: dict[int, tuple[int | None, str]], timeout_s: float) -> dict[int, str]:
    """Waits up to ``timeout_s`` for every process of ``procs`` to end; the ones still
    running then (empty when all are gone)."""
    deadline = time.monotonic() + timeout_s
    while survivors(procs) and time.monotonic() < deadline:
        time.sleep(0.2)  # other processes' lifetimes: nothing local to wait on
    return survivors(procs)


def kill_all(procs: dict[int, tuple[int | None, str]]) -> None:
    """Test cleanup: SIGKILL whatever of ``procs`` still runs (same pid and start time)."""
    for pid in survivors(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def metric_lines(run_dir: Path) -> list[dict[str, object]]:
    """The training steps' lines (the held-out evaluations' left out)."""
    return read_step_lines(run_dir / "metrics.jsonl")


def events(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "supervisor.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, proc: subprocess.Popen[bytes], output: Path
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"launch exited early ({proc.returncode}):\n{output.read_text()}")
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
