"""Processes started by the launcher end when the launcher ends, even when it is SIGKILLed.

The launcher exports its pid and start time (``HYBRIDFLOW_LAUNCHER_PID``,
``HYBRIDFLOW_LAUNCHER_START``); each process it starts, directly or through torchrun, calls
:func:`watch_parent` right after parsing its arguments. Two mechanisms, because each covers
what the other cannot:

- ``PR_SET_PDEATHSIG`` (Linux): the kernel sends SIGTERM the moment the direct parent dies.
  It is armed only where the direct parent is the launcher: it is about the parent *thread*,
  and a torchrun rank's parent is torchrun, not the launcher.
- A watchdog thread polls the launcher's pid every ``poll_s``: gone, a zombie, or a different
  process with the same pid (its start time in /proc differs) all count as dead. Where
  PDEATHSIG was not armed it sends SIGTERM to its own process (a clean drain); in every case
  it ends the process with ``os._exit`` if it still runs ``grace_s`` later.

Without the environment variable (a service started by hand) nothing happens. Knows nothing
of gRPC or of what the process serves; imports only the standard library.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

PID_ENV = "HYBRIDFLOW_LAUNCHER_PID"
START_ENV = "HYBRIDFLOW_LAUNCHER_START"
_PR_SET_PDEATHSIG = 1

log = logging.getLogger(__name__)


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None
    when no live process has this pid (absent or a zombie)."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    state, start = after_name[0], after_name[19]
    if state in ("Z", "X"):
        return None
    return int(start)


def is_alive(pid: int, start_ticks: int | None) -> bool:
    """True while ``pid`` is a live process and, if ``start_ticks`` is given, the same one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else: the start time decides
    current = process_start_ticks(pid)
    if current is None:
        return False
    return start_ticks is None or current == start_ticks


def launcher_env() -> dict[str, str]:
    """What the launcher exports to every process it starts so they can watch it."""
    pid = os.getpid()
    start = process_start_ticks(pid)
    env = {PID_ENV: str(pid)}
    if start is not None:
        env[START_ENV] = str(start)
    return env


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Asks the kernel to send ``sig`` to this process when its parent thread exits (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(
    poll_s: float = 1.0,
    grace_s: float = 15.0,
    environ: dict[str, str] | None = None,
) -> threading.Thread | None:
    """Ends this process when the launcher named in the environment dies (see the module
    docstring). Returns the watchdog thread, or None when there is no launcher to watch."""
    env = os.environ if environ is None else environ
    raw = env.get(PID_ENV, "")
    if not raw:
        return None
    try:
        launcher_pid = int(raw)
        start = int(env[START_ENV]) if env.get(START_ENV) else None
    except ValueError:
        log.warning("ignoring %s=%r: not a pid", PID_ENV, raw)
        return None
    armed = os.getppid() == launcher_pid and set_parent_death_signal(signal.SIGTERM)
    if armed and os.getppid() != launcher_pid:
        # The launcher died between the check and prctl: the signal will never come.
        armed = False
    watchdog = Watchdog(launcher_pid, start, terminate_self=not armed, grace_s=grace_s)
    thread = threading.Thread(
        target=watchdog.run, args=(poll_s,), name="launcher-lifeline", daemon=True
    )
    thread.start()
    return thread


class Watchdog:
    """Polls the launcher; when it is gone, SIGTERMs this process (unless PDEATHSIG will)
    and hard-exits after ``grace_s``. ``sleep``/``alive``/``kill``/``exit`` are injectable
    for tests."""

    def __init__(
        self,
        launcher_pid: int,
        start_ticks: int | None,
        terminate_self: bool,
        grace_s: float,
        alive: Callable[[int, int | None], bool] = is_alive,
        sleep: Callable[[float], None] = time.sleep,
        kill: Callable[[int, int], None] = os.kill,
        hard_exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.launcher_pid = launcher_pid
        self.start_ticks = start_ticks
        self.terminate_self = terminate_self
        self.grace_s = grace_s
        self._alive = alive
        self._sleep = sleep
        self._kill = kill
        self._exit = hard_exit

    def run(self, poll_s: float) -> None:
        while self._alive(self.launcher_pid, self.start_ticks):
            self._sleep(poll_s)
        print(
            f"launcher (pid {self.launcher_pid}) is gone; stopping pid {os.getpid()}",
            file=sys.stderr,
            flush=True,
        )
        if self.terminate_self:
            self._kill(os.getpid(), signal.SIGTERM)
        self._sleep(self.grace_s)
        self._exit(1)


def main(argv: list[str] | None = None) -> None:
    """``python -m hybridflow.deploy.lifeline MODULE [ARGS...]``: runs ``python -m MODULE
    ARGS...`` under :func:`watch_parent`. The launcher starts torchrun this way, since
    torchrun has no hook of its own."""
    import runpy

    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m hybridflow.deploy.lifeline MODULE [ARGS...]")
    watch_parent()
    sys.argv = [args[0], *args[1:]]
    runpy.run_module(args[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
