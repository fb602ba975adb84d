"""Watches the coordinator and the services while a job runs; decides restarts and stops.

A poll loop in the launcher's main thread (children are spawned from it, so their
parent-death signal stays tied to the launcher's life, not a helper thread's):

- a rollout, reward or environment service that exits is restarted on the same host:port after a
  doubling backoff, up to ``deploy.restart_budget`` times per service, and counts as back
  once its health check answers;
- the learner exiting, the coordinator failing, or a spent budget stops the job: the
  coordinator is ended (at once when the learner is gone: nothing consistent can be saved;
  else SIGTERM, then SIGKILL after ``deploy.stop_timeout_s``) and ``run`` returns the cause;
- a stop request (SIGTERM / Ctrl-C) SIGTERMs the coordinator, which stops after its step and
  saves; it is SIGKILLed if still running ``stop_timeout_s`` later, or at once on a second
  request.

Every decision is one JSON line in ``run_dir/supervisor.jsonl``. Stopping the services is
the caller's (``ServiceGroup.stop``). Knows processes and the group's small interface, not
gRPC; time comes from an injectable clock and sleep.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hybridflow.utils.disk import disk_full_message, is_disk_full

EXIT_REFUSED = 2
"""The coordinator's exit status when it refuses the job before training: a bad config or
dataset, a resume that changes what the checkpoint cannot honour, no checkpoint that
verifies. No resume hint follows it."""

log = logging.getLogger("launch")

RESTARTABLE_PREFIXES = ("rollout", "reward", "environment")


class SupervisedProcess(Protocol):
    """What the supervisor needs of one service process."""

    name: str
    popen: subprocess.Popen[Any]
    log_path: Path
    address: str


class SupervisedGroup(Protocol):
    """What the supervisor needs of the services (``ServiceGroup`` implements it)."""

    def live_processes(self) -> list[Any]: ...

    def restart(self, proc: Any) -> Any:
        """Starts ``proc``'s service again on its address; returns the new process."""
        ...

    def check_ready(self, proc: Any) -> bool:
        """True once the restarted service serves (port file written, health SERVING)."""
        ...


class EventLog:
    """Appends one JSON object per supervisor event to a file (``supervisor.jsonl``).

    A write that fails (a full disk) is logged once, naming the file and the free space, and
    the supervisor goes on deciding: it must still stop the job cleanly."""

    def __init__(self, path: Path, wall_clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._wall_clock = wall_clock
        self._failed = False

    def write(self, service: str, event: str, **fields: Any) -> dict[str, Any]:
        record = {"time": self._wall_clock(), "service": service, "event": event, **fields}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:
            if not self._failed:
                self._failed = True
                why = disk_full_message(self.path, exc) if is_disk_full(exc) else str(exc)
                log.error("cannot write the supervisor's event log: %s", why)
        return record


@dataclass
class Outcome:
    """How the job ended. ``cause`` is None when the coordinator finished on its own."""

    code: int
    cause: str | None = None
    stopped_by_request: bool = False


@dataclass
class _Restart:
    proc: Any
    attempts: int = 0
    not_before: float = 0.0
    """Earliest time of the next spawn (the backoff)."""
    started_at: float | None = None
    """When the current attempt was spawned; None while waiting out the backoff."""
    last_exit: int | None = None


@dataclass
class Supervisor:
    """Watches the services and the coordinator for the launcher: restarts a dead rollout,
    reward or environment service within its budget, stops the job when the learner or the coordinator dies,
    and records every exit and restart in the event log."""

    group: SupervisedGroup
    coordinator: subprocess.Popen[Any]
    events: EventLog
    restart_budget: int = 3
    restart_backoff_s: float = 1.0
    stop_timeout_s: float = 60.0
    health_timeout_s: float = 600.0
    poll_s: float = 0.2
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _stop_requests: int = 0
    _handled_requests: int = 0
    _stop_deadline: float | None = None
    _fatal: str | None = None
    _killed: str | None = None
    _restarts: dict[str, _Restart] = field(default_factory=dict)
    _attempts: dict[str, int] = field(default_factory=dict)

    def request_stop(self) -> None:
        """From a signal handler: the first request stops gracefully, a second kills."""
        self._stop_requests += 1

    @property
    def num_stop_requests(self) -> int:
        return self._stop_requests

    def run(self) -> Outcome:
        while True:
            now = self.clock()
            self._handle_stop_requests(now)
            code = self.coordinator.poll()
            if code is not None:
                return self._finish(code)
            if self._stop_deadline is None:
                self._watch_services(now)
            elif now >= self._stop_deadline:
                self._kill_coordinator(f"did not stop within {self.stop_timeout_s:.0f}s")
                continue
            self.sleep(self.poll_s)

    # -- stopping ---------------------------------------------------------------------------

    def _handle_stop_requests(self, now: float) -> None:
        requests = self._stop_requests
        if requests == self._handled_requests:
            return
        self._handled_requests = requests
        if self.coordinator.poll() is not None:
            return
        if requests == 1 and self._stop_deadline is None:
            log.info(
                "stopping: the coordinator finishes its step and saves (up to %.0fs; "
                "Ctrl-C / SIGTERM again to kill now)",
                self.stop_timeout_s,
            )
            self._terminate_coordinator(now, "stop requested")
        else:
            self._kill_coordinator("second stop request")

    def _terminate_coordinator(self, now: float, reason: str) -> None:
        self.events.write("coordinator", "sigterm", pid=self.coordinator.pid, reason=reason)
        _signal(self.coordinator, signal.SIGTERM)
        self._stop_deadline = now + self.stop_timeout_s

    def _kill_coordinator(self, reason: str) -> None:
        if self.coordinator.poll() is None:
            log.warning("killing the coordinator (pid %d): %s", self.coordinator.pid, reason)
            self.events.write("coordinator", "sigkill", pid=self.coordinator.pid, reason=reason)
            _signal(self.coordinator, signal.SIGKILL)
        self.coordinator.wait()
        if self._killed is None:
            self._killed = reason

    def _finish(self, code: int) -> Outcome:
        self.events.write("coordinator", "exited", pid=self.coordinator.pid, exit_code=code)
        if self._fatal is not None:
            return Outcome(1, self._fatal)
        if self._stop_requests:
            if self._killed is not None:
                return Outcome(1, f"coordinator killed: {self._killed}", stopped_by_request=True)
            if code != 0:
                return Outcome(1, f"coordinator exited with code {code}", True)
            return Outcome(0, None, stopped_by_request=True)
        if code == 0:
            return Outcome(0)
        if code == EXIT_REFUSED:  # its own line said why; a resume would be refused the same
            return Outcome(EXIT_REFUSED)
        # A coordinator that fails often does so because a service died first (and the
        # coordinator, seeing its RPC fail, exited before this loop saw the service): name it.
        for proc in self.group.live_processes():
            exit_code = proc.popen.poll()
            if exit_code is not None and not self._restartable(proc.name):
                self.events.write(proc.name, "exited", pid=proc.popen.pid, exit_code=exit_code)
                cause = _exit_cause(proc, exit_code)
                self.events.write("job", "failed", cause=cause)
                return Outcome(1, cause)
        return Outcome(1, f"coordinator exited with code {code}")

    # -- services ---------------------------------------------------------------------------

    @staticmethod
    def _restartable(name: str) -> bool:
        return name.startswith(RESTARTABLE_PREFIXES)

    def _watch_services(self, now: float) -> None:
        for proc in self.group.live_processes():
            if proc.name in self._restarts:
                continue
            exit_code = proc.popen.poll()
            if exit_code is None:
                continue
            self.events.write(proc.name, "exited", pid=proc.popen.pid, exit_code=exit_code)
            log.warning("%s exited with code %s (see %s)", proc.name, exit_code, proc.log_path)
            if not self._restartable(proc.name):
                self._fail(_exit_cause(proc, exit_code), now, kill_now=proc.name == "learner")
                return
            self._schedule_restart(proc, exit_code, now)
            if self._fatal is not None:
                return
        for name in list(self._restarts):
            self._advance_restart(name, now)
            if self._fatal is not None:
                return

    def _schedule_restart(self, proc: Any, exit_code: int, now: float) -> None:
        attempts = self._attempts.get(proc.name, 0)
        if attempts >= self.restart_budget:
            self.events.write(proc.name, "gave_up", pid=proc.popen.pid, exit_code=exit_code)
            self._fail(
                f"{_exit_cause(proc, exit_code)}; restart budget ({self.restart_budget}) spent",
                now,
            )
            return
        delay = self.restart_backoff_s * 2**attempts
        self._restarts[proc.name] = _Restart(proc, attempts, now + delay, None, exit_code)
        log.info("restarting %s on %s in %.1fs", proc.name, proc.address, delay)

    def _advance_restart(self, name: str, now: float) -> None:
        state = self._restarts[name]
        if state.started_at is None:
            if now < state.not_before:
                return
            state.attempts += 1
            self._attempts[name] = state.attempts
            state.proc = self.group.restart(state.proc)
            state.started_at = now
            self.events.write(name, "restarting", pid=state.proc.popen.pid, attempt=state.attempts)
            return
        proc = state.proc
        exit_code = proc.popen.poll()
        if exit_code is None and self.group.check_ready(proc):
            del self._restarts[name]
            self.events.write(
                name, "restarted", pid=proc.popen.pid, attempt=state.attempts, address=proc.address
            )
            log.info(
                "restarted %s (pid %d, attempt %d/%d)",
                name,
                proc.popen.pid,
                state.attempts,
                self.restart_budget,
            )
            return
        if exit_code is None and now - state.started_at < self.health_timeout_s:
            return
        if exit_code is None:  # never became healthy: end it and count the attempt
            _signal(proc.popen, signal.SIGKILL, group=True)
            exit_code = proc.popen.wait()
            why = f"not healthy after {self.health_timeout_s:.0f}s"
        else:
            why = f"exited with code {exit_code} while starting"
        bind_failed = "could not bind" in _tail(proc.log_path)
        if bind_failed:
            why += f" (its port {proc.address} could not be bound again)"
        self.events.write(name, "restart_failed", pid=proc.popen.pid, exit_code=exit_code)
        log.warning("%s %s (see %s)", name, why, proc.log_path)
        del self._restarts[name]
        self._attempts[name] = state.attempts
        if state.attempts >= self.restart_budget:
            self.events.write(name, "gave_up", pid=proc.popen.pid, exit_code=exit_code)
            self._fail(
                f"{name} {why}; restart budget ({self.restart_budget}) spent (see {proc.log_path})",
                now,
            )
            return
        self._schedule_restart(proc, exit_code, now)

    def _fail(self, cause: str, now: float, kill_now: bool = False) -> None:
        self._fatal = cause
        self.events.write("job", "failed", cause=cause)
        if kill_now:
            self._kill_coordinator(cause)
        else:
            self._terminate_coordinator(now, cause)


def _exit_cause(proc: Any, exit_code: int) -> str:
    return f"{proc.name} exited with code {exit_code} (see {proc.log_path})"


def _signal(popen: subprocess.Popen[Any], sig: int, group: bool = False) -> None:
    import os

    try:
        if group:
            os.killpg(popen.pid, sig)
        else:
            popen.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, num_bytes: int = 4096) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - num_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
