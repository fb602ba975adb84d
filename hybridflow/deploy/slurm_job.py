"""Runs a Slurm plan from the batch step: the services' ``srun`` steps, then the coordinator,
and the stop request in between.

A stop request asks the coordinator to stop after its current step with a checkpoint. It
comes as SIGTERM, SIGINT or SIGUSR1 to this process (``scancel --batch --signal=TERM JOB``,
``#SBATCH --signal=B:USR1@N``, the job's end), or as the stop file a service step's shim
creates when it gets one (``scancel --signal=TERM JOB``, ``--signal=USR1@N``;
:mod:`hybridflow.deploy.slurm_step`). The coordinator runs with SIGTERM blocked: when Slurm
ends the job it signals every process of the batch step, and only this process may turn
that into the request. When the coordinator exits this process writes
``slurm/coordinator.exit``; the shims see it and stop their services, and the steps end.

A Tinker-compatible service's plan is that one process, run here as the coordinator is, and
stopped the same way: SIGINT once it has written ``tinker.addr`` (it stops serving; what it
acknowledged is on disk already).

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

from hybridflow.deploy.slurm_plan import Step, format_plan

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


class StopRequests:
    """Turns SIGTERM, SIGINT, SIGUSR1 and the stop file into one SIGINT to the coordinator:
    stop after the current step, with a checkpoint. One, however many come: when Slurm ends
    a job, this process, the shims and srun all hear of it, and a second SIGINT would make
    the coordinator abort without saving (Slurm's SIGKILL after ``KillWait`` is the hard
    stop). Until the coordinator has written its control address (its handlers are in place
    by then) the request waits: a SIGINT earlier would end it with nothing saved."""

    def __init__(self, stop_file: Path, ready_file: Path) -> None:
        self.stop_file, self.ready_file = stop_file, ready_file
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.requested = False
        self.sent = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        print(f"slurm: {signal.Signals(signum).name}: stopping the job", file=sys.stderr)
        self.requested = True
        self.deliver()

    def poll(self) -> None:
        """The stop file, then the request if the coordinator is now ready for it."""
        if not self.requested and self.stop_file.exists():
            print("slurm: a step was signalled: stopping the job", file=sys.stderr)
            self.requested = True
        self.deliver()

    def deliver(self) -> None:
        coordinator = self.coordinator
        if not self.requested or self.sent or coordinator is None:
            return
        if coordinator.poll() is None and self.ready_file.exists():
            self.sent = True
            coordinator.send_signal(signal.SIGINT)


def run_plan(steps: Sequence[Step], run_dir: Path) -> int:
    """Writes the plan, starts the services' steps and the coordinator, passes stop requests
    on (:class:`StopRequests`) until it exits, then stops the steps. Returns the
    coordinator's exit code."""
    exit_file, stop_file = control_files(run_dir)
    exit_file.parent.mkdir(parents=True, exist_ok=True)
    ready_file = run_dir / f"{steps[-1].name}.addr"  # the coordinator's, or the tinker service's
    for stale in (exit_file, stop_file, ready_file):  # an earlier start's (a requeued job)
        stale.unlink(missing_ok=True)
    (exit_file.parent / PLAN_FILE).write_text(format_plan(steps) + "\n")
    (run_dir / "logs").mkdir(exist_ok=True)
    requests = StopRequests(stop_file, ready_file)
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
        requests.coordinator = coordinator
        while True:
            try:
                code = coordinator.wait(POLL_S)
                break
            except subprocess.TimeoutExpired:
                requests.poll()
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
