"""Fake processes for supervisor tests: real children that exit when told, and a group."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Exits with the code written to its stdin; ignores SIGTERM when asked to (a blocked process).
CHILD = """
import signal, sys
if sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif sys.argv[1] == "term-exits-0":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ready", flush=True)
line = sys.stdin.readline()
sys.exit(int(line or 0))
"""


def child(mode: str = "plain") -> subprocess.Popen[bytes]:
    """mode: plain (SIGTERM kills it), ignore-term (blocked), term-exits-0 (a clean stop)."""
    popen = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert popen.stdout is not None
    assert popen.stdout.readline() == b"ready\n"  # its signal disposition is in place
    return popen


def exit_with(popen: subprocess.Popen[bytes], code: int) -> None:
    """Makes the child exit with ``code`` and waits until it has (no race with poll)."""
    assert popen.stdin is not None
    popen.stdin.write(f"{code}\n".encode())
    popen.stdin.flush()
    popen.wait(timeout=30)


@dataclass
class FakeProc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    address: str = "127.0.0.1:5000"


@dataclass
class FakeGroup:
    """The supervisor's view of the services; restarts spawn fresh fake children."""

    log_dir: Path
    processes: list[FakeProc] = field(default_factory=list)
    ready: bool = True
    restarts: list[str] = field(default_factory=list)

    def add(self, name: str) -> FakeProc:
        proc = FakeProc(name, child(), self.log_dir / f"{name}.log")
        self.processes.append(proc)
        return proc

    def get(self, name: str) -> FakeProc:
        return next(p for p in self.processes if p.name == name)

    def live_processes(self) -> list[Any]:
        return list(self.processes)

    def restart(self, proc: Any) -> Any:
        new = FakeProc(proc.name, child(), proc.log_path, proc.address)
        self.processes[self.processes.index(proc)] = new
        self.restarts.append(proc.name)
        return new

    def check_ready(self, proc: Any) -> bool:
        return self.ready

    def close(self) -> None:
        for p in self.processes:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()


class Script:
    """An injected clock and sleep: each sleep advances time and runs the actions due."""

    def __init__(self) -> None:
        self.now = 0.0
        self.actions: list[tuple[float, Any]] = []
        self.max_time = 1000.0

    def at(self, t: float, action: Any) -> None:
        self.actions.append((t, action))
        self.actions.sort(key=lambda a: a[0])

    def clock(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        self.now += dt
        time.sleep(0.001)  # lets a signalled child exit; the assertions use fake time only
        assert self.now < self.max_time, "supervisor did not finish"
        while self.actions and self.actions[0][0] <= self.now:
            _, action = self.actions.pop(0)
            action()
