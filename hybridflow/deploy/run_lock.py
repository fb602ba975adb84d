"""One job per run directory: an exclusive ``flock`` on ``<run dir>/.lock``.

The launcher (and a coordinator started by hand) takes the lock before it writes anything
else in the run directory and holds it for the job's life; the kernel releases it when the
holding process dies, SIGKILL included, so a crashed job never leaves a stale lock to clean
up. A second launch, or a ``--resume`` of a live run, is refused at once with one line naming
the holder's pid, host and start time (written into the lock file by the holder).

The lock file is opened close-on-exec: the services the launcher starts do not inherit it,
so it is held exactly as long as the launcher lives. A coordinator run under the launcher
finds the lock held by its parent and goes on (``held_by_parent``).

Knows nothing of configs or services; Linux / POSIX only (``fcntl``).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = ".lock"


@dataclass(frozen=True)
class Holder:
    """Who holds a run directory's lock (as the holder wrote it)."""

    pid: int
    host: str
    started: float
    """time.time() when the lock was taken."""

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host} (since {when})"


class RunDirBusy(RuntimeError):
    """The run directory is locked by a live job."""

    def __init__(self, run_dir: Path, holder: Holder | None) -> None:
        who = holder.describe() if holder else "a process that has not written its pid yet"
        super().__init__(f"{run_dir} is in use by a running job: {who}")
        self.holder = holder


class RunLock:
    """A held lock; ``release`` (or process exit) gives it back."""

    def __init__(self, path: Path, fd: int, holder: Holder) -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def lock_run_dir(run_dir: Path) -> RunLock:
    """Takes ``run_dir``'s lock without waiting; RunDirBusy naming the holder if taken."""
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusy(run_dir, read_holder(run_dir)) from None
    holder = Holder(pid=os.getpid(), host=socket.gethostname(), started=time.time())
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder.__dict__) + "\n").encode(), 0)
    return RunLock(path, fd, holder)


def raise_if_busy(run_dir: Path) -> None:
    """RunDirBusy naming the holder when a live job holds ``run_dir``'s lock; takes nothing
    and writes nothing (a ``--resume`` checks this before it reads the run's files, so a
    live run is reported as live, not as half-written)."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return  # no run there (yet): nothing holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunDirBusy(run_dir, read_holder(run_dir)) from None
    finally:
        os.close(fd)


def read_holder(run_dir: Path) -> Holder | None:
    """What the lock file says about its last holder (None: empty or unreadable)."""
    try:
        raw = json.loads((run_dir / LOCK_FILE).read_text())
        return Holder(int(raw["pid"]), str(raw["host"]), float(raw["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def acquire_unless_parent_holds(run_dir: Path) -> RunLock | None:
    """For a process the launcher may have started (the coordinator): None when the lock is
    held by this process's parent on this host (the launcher holds it for the job), else the
    lock taken here; RunDirBusy when another job holds it."""
    try:
        return lock_run_dir(run_dir)
    except RunDirBusy as busy:
        holder = busy.holder
        if holder and holder.pid == os.getppid() and holder.host == socket.gethostname():
            return None
        raise
