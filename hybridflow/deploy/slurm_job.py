"""Runs a Slurm plan from the batch step: the services' ``srun`` steps, then the coordinator,
and the stop requests in between.

A stop request asks the coordinator to stop after its current step with a checkpoint: one
SIGINT for the first, a second (abort) for a second. It comes as SIGTERM, SIGINT or SIGUSR1
to this process (``scancel --batch --signal=TERM JOB``, ``#SBATCH --signal=B:USR1@N``), or as
the stop file a service step's shim creates when it gets one (``scancel --signal=TERM JOB``,
``--signal=USR1@N``; :mod:`hybridflow.deploy.slurm_step`). The coordinator runs with SIGTERM
blocked: when Slurm ends the job it signals every process of the batch step, and only this
process may turn that into requests, or the coordinator would see two and abort. When the
coordinator exits this process writes ``slurm/coordinator.exit``; the shims see it and stop
their services, and the steps end.

Files under ``<run dir>/slurm/``: ``plan.txt`` (the plan this start runs, as the dry run
prints it), ``coordinator.exit`` (its exit code), ``stop`` (a stop request).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from hybridflow.deploy.slurm import Step, format_plan

CONTROL_DIR = "slurm"
EXIT_FILE = "coordinator.exit"
STOP_FILE = "stop"
PLAN_FILE = "plan.txt"
POLL_S = 0.5
STEPS_STOP_TIMEOUT_S = 60.0
"""After the coordinator exits: how long the services' steps get to stop before their srun
gets SIGTERM (which srun turns into SIGKILL for its tasks)."""


def control_files(run_dir: Path) -> tuple[Path, Path]:
    """The exit file and the stop file of a run (what the steps' shims are pointed at)."""
    control = run_dir / CONTROL_DIR
    return control / EXIT_FILE, control / STOP_FILE


class _StopRequests:
    """Turns SIGTERM, SIGINT, SIGUSR1 and the stop file into SIGINTs to the coordinator:
    the first asks it to stop after its step (with a checkpoint), a second aborts it."""

    def __init__(self, stop_file: Path) -> None:
        self.stop_file = stop_file
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.num_requests = 0
        self.stop_file_seen = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        print(f"slurm: {signal.Signals(signum).name}: stopping the job", file=sys.stderr)
        self.request()

    def poll_stop_file(self) -> None:
        if not self.stop_file_seen and self.stop_file.exists():
            self.stop_file_seen = True
            print("slurm: a step asked to stop (SIGUSR1)", file=sys.stderr)
            self.request()

    def request(self) -> None:
        self.num_requests += 1
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGINT)

    def started(self, coordinator: subprocess.Popen[bytes]) -> None:
        """The coordinator is running: a request that came before it is passed on now."""
        self.coordinator = coordinator
        for _ in range(min(self.num_requests, 2)):
            coordinator.send_signal(signal.SIGINT)


def run_plan(steps: Sequence[Step], run_dir: Path) -> int:
    """Writes the plan, starts the services' steps and the coordinator, passes stop requests
    on (:class:`_StopRequests`) until it exits, then stops the steps. Returns the
    coordinator's exit code."""
    exit_file, stop_file = control_files(run_dir)
    exit_file.parent.mkdir(parents=True, exist_ok=True)
    for stale in (exit_file, stop_file):  # an earlier start's (a requeued job)
        stale.unlink(missing_ok=True)
    (exit_file.parent / PLAN_FILE).write_text(format_plan(steps) + "\n")
    (run_dir / "logs").mkdir(exist_ok=True)
    requests = _StopRequests(stop_file)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, requests.on_signal)
    # Own sessions: a signal to this process's group is this process's to pass on.
    services = [subprocess.Popen(step.command, start_new_session=True) for step in steps[:-1]]
    code = 1
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            coordinator = subprocess.Popen(steps[-1].command, start_new_session=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        requests.started(coordinator)
        while True:
            try:
                code = coordinator.wait(POLL_S)
                break
            except subprocess.TimeoutExpired:
                requests.poll_stop_file()
    finally:
        exit_file.write_text(f"{code}\n")
        _stop_steps(services)
    return code


def _stop_steps(services: Sequence[subprocess.Popen[bytes]]) -> None:
    """Waits for each step to end (its shim stops the service once the exit file is there);
    SIGTERM to the srun of one still running after ``STEPS_STOP_TIMEOUT_S``. Not SIGTERM
    first: srun answers it by SIGKILLing its tasks, with no drain."""
    deadline = time.monotonic() + STEPS_STOP_TIMEOUT_S
    for srun in services:
        try:
            srun.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            srun.terminate()
            srun.wait()
