"""Job lifecycle state machine driven by the control API (pause / resume / stop), and the
door to the job's replicas (scale).

States: starting → running ⇄ paused → stopping → done, or → failed from anywhere.
Pause and stop take effect between steps: a step in flight always finishes, so nothing is
half-trained. ``scale`` adds or drains replicas at once, between or during steps (the job's
``scale``, attached once its dispatchers run). Thread-safe; knows nothing of gRPC.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hybridflow.coordinator.scaling import ReplicaStatus
from hybridflow.errors import FailedPrecondition

ScaleFn = Callable[[Sequence[str], Sequence[str]], list[ReplicaStatus]]
"""scale(add, remove) -> the replicas then (``TrainingJob.scale``)."""

STATES = ("starting", "running", "paused", "stopping", "done", "failed")


@dataclass
class JobStatus:
    """A snapshot of the running job as the control API reports it."""

    state: str
    step: int
    total_steps: int
    policy_version: int
    last_metrics: dict[str, float] = field(default_factory=dict)
    run_dir: str = ""
    error: str = ""
    waiting_for: str = ""
    """What the job is blocked on (a restarting replica, ...); empty when it is not."""
    replicas: list[ReplicaStatus] = field(default_factory=list)
    """Every rollout replica the job has had, with its state (empty before it runs)."""


class JobControl:
    """The job's status and its pause / stop requests, shared between the trainer loop and
    the control API, under one condition variable."""

    def __init__(self, total_steps: int, run_dir: str = "") -> None:
        self._cond = threading.Condition()
        self._status = JobStatus("starting", 0, total_steps, 0, run_dir=run_dir)
        self._stop_requested = False
        self._pause_requested = False
        self._scale: ScaleFn | None = None
        self._replicas: Callable[[], list[ReplicaStatus]] | None = None

    def status(self) -> JobStatus:
        replicas = self._replicas() if self._replicas is not None else []
        with self._cond:
            s = self._status
            return JobStatus(
                s.state,
                s.step,
                s.total_steps,
                s.policy_version,
                dict(s.last_metrics),
                s.run_dir,
                s.error,
                s.waiting_for,
                replicas,
            )

    def attach_replicas(self, scale: ScaleFn, replicas: Callable[[], list[ReplicaStatus]]) -> None:
        """The running job's ``scale`` and its replicas' states (``TrainingJob.open``)."""
        self._scale, self._replicas = scale, replicas

    def scale(self, add: Sequence[str], remove: Sequence[str]) -> JobStatus:
        """Adds replicas at ``add`` and drains those at ``remove`` (``TrainingJob.scale``);
        ``ValueError`` for a request it refuses; ``FailedPrecondition`` before the job's
        replicas run, or once the job is ending."""
        if self._scale is None:
            raise FailedPrecondition(
                "scale: the job's replicas are not running yet; try again shortly"
            )
        state = self.status().state
        if state in ("stopping", "done", "failed"):
            raise FailedPrecondition(f"scale: the job is {state}")
        self._scale(add, remove)
        return self.status()

    @property
    def stop_requested(self) -> bool:
        with self._cond:
            return self._stop_requested

    @property
    def pause_requested(self) -> bool:
        with self._cond:
            return self._pause_requested

    def start(self) -> None:
        with self._cond:
            self._status.state = "running"
            self._cond.notify_all()

    def pause(self) -> JobStatus:
        with self._cond:
            if self._status.state in ("starting", "running"):
                self._pause_requested = True
        return self.status()

    def resume(self) -> JobStatus:
        with self._cond:
            self._pause_requested = False
            if self._status.state == "paused":
                self._status.state = "running"
            self._cond.notify_all()
        return self.status()

    def stop(self) -> JobStatus:
        with self._cond:
            self._stop_requested = True
            if self._status.state not in ("done", "failed"):
                self._status.state = "stopping"
            self._cond.notify_all()
        return self.status()

    def set_waiting(self, what: str) -> None:
        """Shows in ``status`` what the job waits on ("" when it no longer waits)."""
        with self._cond:
            self._status.waiting_for = what

    def step_done(self, step: int, policy_version: int, metrics: dict[str, float]) -> None:
        with self._cond:
            self._status.step = step
            self._status.policy_version = policy_version
            self._status.last_metrics = dict(metrics)

    def wait_to_continue(self, timeout_s: float | None = None) -> bool:
        """Called between steps: blocks while paused; False once a stop was requested."""
        with self._cond:
            if self._pause_requested and not self._stop_requested:
                self._status.state = "paused"
                self._cond.notify_all()
                self._cond.wait_for(
                    lambda: not self._pause_requested or self._stop_requested, timeout_s
                )
                if self._status.state == "paused":
                    self._status.state = "running"
            return not self._stop_requested

    def wait_for_state(self, states: tuple[str, ...], timeout_s: float) -> bool:
        """Blocks until the job is in one of ``states`` (tests and the CLI use it)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._status.state in states, timeout_s)

    def finish(self, error: str = "") -> None:
        with self._cond:
            self._status.state = "failed" if error else "done"
            self._status.error = error
            self._cond.notify_all()
