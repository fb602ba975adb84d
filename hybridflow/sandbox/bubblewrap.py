"""The sandbox on Debian's ``bubblewrap`` (``bwrap``): unprivileged namespaces, no daemon.

One run is one ``bwrap`` process:

- namespaces: all of them (``--unshare-all``: user, PID, network, IPC, UTS, cgroup), so the
  program sees no network but its own empty loopback (none of our services' ports), only
  its own processes, and runs as uid/gid 65534;
- files: ``/usr`` read-only (with ``/bin``, ``/lib``, ``/lib64`` as links into it), a fresh
  ``/proc`` and ``/dev``, an empty ``/tmp``, and a private scratch directory ``/box`` (the
  working directory) holding the files given, on a read-only root of its own; nothing else
  of the host (no run directory, no token file, no home), an empty environment but ``PATH``;
- the program is the namespace's pid 1 (``--as-pid-1``): bwrap's own init would be left a
  zombie by bwrap, which exits on its exit code before reaping it; where the host's pid 1
  does not reap orphans (a container's init) those zombies count against the uid's process
  limit, and after ``processes`` runs every run failed to fork. As pid 1 the program's exit
  ends the namespace, every process in it killed;
- limits: set by util-linux's ``prlimit`` before it execs ``bwrap``, as the sandbox's host uid also when the
  caller is root (CPU seconds, address space, processes, open files, file size, no core
  files), a wall-time deadline and an output cap enforced here; past either, the whole
  process group is killed, and with it the PID namespace (``--die-with-parent``: its pid 1
  dies with bwrap, so nothing it started outlives it).

The interpreter inside is the system's (``/usr/bin/python3``), not the project's venv: the
program gets the standard library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from hybridflow.sandbox.types import SandboxLimits, SandboxResult, SandboxUnavailable

INSIDE_UID = 65534
SCRATCH = "/box"


class BubblewrapSandbox:
    """``Sandbox`` on bubblewrap (module docstring). Checks at construction that ``bwrap``
    exists and can make its namespaces here (``SandboxUnavailable`` if not)."""

    def __init__(self, bwrap: str = "bwrap", uid: int = INSIDE_UID) -> None:
        """``uid``: the host uid a root caller runs the program's processes as (their
        ``RLIMIT_NPROC`` is counted per uid: a pool gives each of its slots its own, so one
        slot's fork bomb cannot starve another's programs); inside they are 65534 always."""
        if not 0 < uid < 2**31 - 1:  # bwrap reads it as a signed int
            raise ValueError(f"uid must be in 1..2**31-2, got {uid}")
        self.uid = uid
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxUnavailable(
                f"{bwrap!r} is not installed: the code sandbox needs bubblewrap "
                "(apt-get install bubblewrap); nothing runs unsandboxed"
            )
        self.bwrap = found
        tools = {name: shutil.which(name) for name in ("prlimit", "setpriv")}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise SandboxUnavailable(
                f"{missing} not installed: the code sandbox sets its uid and limits with "
                "util-linux's setpriv and prlimit (apt-get install util-linux); nothing runs "
                "unsandboxed"
            )
        self.prlimit, self.setpriv = str(tools["prlimit"]), str(tools["setpriv"])
        self._root = os.geteuid() == 0
        probe = self.run(["/usr/bin/true"], {}, SandboxLimits(wall_s=30))
        if probe.outcome != "ok":
            raise SandboxUnavailable(
                f"bubblewrap cannot make its namespaces here ({probe.reason or probe.outcome}: "
                f"{probe.stderr.decode(errors='replace').strip()[:300]}); nothing runs "
                "unsandboxed"
            )

    def command(self, argv: list[str], scratch: Path) -> list[str]:
        """The ``bwrap`` command line that runs ``argv`` with ``scratch`` as ``/box``."""
        return [
            self.bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",  # no init of bwrap's own, left a zombie (module docstring)
            "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID),
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64",
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
            "--bind", str(scratch), SCRATCH,
            "--remount-ro", "/",  # its own root, read-only too: /box and /tmp alone take writes
            "--chdir", SCRATCH,
            "--clearenv",
            "--setenv", "PATH", "/usr/bin",
            "--setenv", "HOME", SCRATCH,
            "--",
            *argv,
        ]  # fmt: skip

    def run(
        self,
        argv: list[str],
        files: Mapping[str, str | bytes],
        limits: SandboxLimits,
        stdin: bytes = b"",
    ) -> SandboxResult:
        scratch = Path(tempfile.mkdtemp(prefix="hybridflow-sandbox-"))
        try:
            _write_files(scratch, files)
            if self._root:  # bwrap runs as self.uid (``prefix``): the scratch is its
                for path in (scratch, *scratch.rglob("*")):
                    os.chown(path, self.uid, self.uid)
            return self._run([*self.prefix(limits), *self.command(argv, scratch)], limits, stdin)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def prefix(self, limits: SandboxLimits) -> list[str]:
        """What runs before bwrap, each exec'ing the next: for a root caller ``setpriv``
        becoming ``self.uid`` (root's processes are exempt from RLIMIT_NPROC, and bwrap needs
        no privilege), then ``prlimit`` setting the limits bwrap and the program inherit.
        Programs, not Popen's ``preexec_fn`` or ``user=``: either makes Popen fork instead of
        vfork, and in a process with grpc's threads its fork handlers crashed the child
        (SIGSEGV, SIGABRT)."""
        become = [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        return [
            *(become if self._root else []),
            self.prlimit,
            # soft = hard: SIGKILL at the limit (the program, the namespace's pid 1, ignores
            # SIGXCPU, so a soft limit below the hard one would let it run a second more)
            f"--cpu={limits.cpu_s}:{limits.cpu_s}",
            f"--as={limits.memory_bytes}",
            f"--nproc={limits.processes}",
            f"--nofile={limits.open_files}",
            f"--fsize={limits.file_bytes}",
            "--core=0",
            "--",
        ]

    def _run(self, cmd: list[str], limits: SandboxLimits, stdin: bytes) -> SandboxResult:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
            )
        except OSError as exc:
            return SandboxResult("error", None, b"", b"", 0.0, f"bwrap did not start: {exc}")
        # One event wakes the wait: the process ended, or a pipe passed the output cap.
        wake = threading.Event()
        over = threading.Event()
        out = _Reader(proc.stdout, limits.output_bytes, over, wake)
        err = _Reader(proc.stderr, limits.output_bytes, over, wake)
        threading.Thread(target=_wait_then_set, args=(proc, wake), daemon=True).start()
        # stdin from a thread too: a program that never reads a large input must not block
        # the wait for its deadline (its pipe closes when it is killed).
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
        wake.wait(max(0.0, start + limits.wall_s - time.monotonic()))
        timed_out = proc.poll() is None and not over.is_set()
        if proc.poll() is None:
            _kill_group(proc)
        proc.wait()
        out.join()
        err.join()
        wall = time.monotonic() - start
        return _result(proc.returncode, out.data, err.data, wall, timed_out, over.is_set(), limits)


class _Reader(threading.Thread):
    """Reads one pipe up to ``cap`` bytes; sets ``over`` (and ``wake``) when more comes."""

    def __init__(
        self, pipe: object, cap: int, over: threading.Event, wake: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        self.pipe, self.cap, self.over, self.wake = pipe, cap, over, wake
        self.data = b""
        self.start()

    def run(self) -> None:
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = self.pipe.read1(65536)  # type: ignore[attr-defined]
            if not chunk:
                break
            if size < self.cap:
                chunks.append(chunk[: self.cap - size])
            size += len(chunk)
            if size > self.cap:
                self.over.set()
                self.wake.set()
        self.data = b"".join(chunks)


def _wait_then_set(proc: subprocess.Popen[bytes], event: threading.Event) -> None:
    proc.wait()
    event.set()


def _feed(proc: subprocess.Popen[bytes], stdin: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(stdin)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # it ended (or stopped reading) before taking all of its input


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap and, with it, the PID namespace
    except ProcessLookupError:
        pass


def _write_files(scratch: Path, files: Mapping[str, str | bytes]) -> None:
    for name, content in files.items():
        path = (scratch / name).resolve()
        if name.startswith("/") or scratch.resolve() not in path.parents:
            raise ValueError(f"sandbox file {name!r}: must be a relative path inside the scratch")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        path.write_bytes(data)


def _result(
    code: int,
    stdout: bytes,
    stderr: bytes,
    wall: float,
    timed_out: bool,
    flooded: bool,
    limits: SandboxLimits,
) -> SandboxResult:
    if flooded:
        reason = f"output past {limits.output_bytes} bytes"
        return SandboxResult("output", code, stdout, stderr, wall, reason)
    if timed_out:
        reason = f"wall time past {limits.wall_s:g}s"
        return SandboxResult("timeout", code, stdout, stderr, wall, reason)
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (
        code in (-signal.SIGKILL, 128 + signal.SIGKILL) and not timed_out
    ):
        reason = f"CPU time past {limits.cpu_s}s"
        return SandboxResult("cpu", code, stdout, stderr, wall, reason)
    if b"MemoryError" in stderr or b"Cannot allocate memory" in stderr:
        reason = f"memory past {limits.memory_bytes} bytes"
        return SandboxResult("memory", code, stdout, stderr, wall, reason)
    if code == 0:
        return SandboxResult("ok", 0, stdout, stderr, wall)
    return SandboxResult("exit", code, stdout, stderr, wall, f"exited with {code}")
