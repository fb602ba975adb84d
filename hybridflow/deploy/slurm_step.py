"""``python -m hybridflow.deploy.slurm_step``: the task of one service's ``srun`` step.

The service runs until the coordinator has exited: the batch step writes ``--exit-file``
then, and this shim, which polls for it, stops the service (``--stop``, below; SIGKILL to
its process group ``KILL_AFTER_S`` later if it is still there). The service itself runs with
SIGTERM and SIGUSR1 blocked (the mask survives exec and torchrun's ranks inherit it), so
that a signal Slurm sends to the steps does not end it before the coordinator's last
checkpoint: the shim takes them and creates ``--stop-file``, which the batch step turns into
"stop after the current step, with a checkpoint". That covers ``scancel --signal=TERM JOB``
(the steps, not the batch step), ``scancel --signal=USR1 JOB`` and ``#SBATCH
--signal=USR1@N`` before the time limit. A plain ``scancel`` or a requeue is another matter:
srun answers the job's end by SIGKILLing its tasks at once.

``--stop``: ``process`` sends SIGINT to the service's process (a service's own stop);
``children`` to that process's children: torchrun's ranks on the learner's first node,
where rank 0 drains and relays the shutdown to the others, and torchrun exits 0 once they
have (SIGINT to torchrun itself would make it kill its ranks and fail); ``wait`` sends
nothing: the learner's other nodes, whose ranks leave on rank 0's relayed shutdown.

SIGINT stops the service at once. Knows nothing of what the service is; imports only the
standard library. Exits with the service's exit code.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

HELD_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}
"""Blocked in the service: the shim decides when it stops."""
POLL_S = 0.2
STOP_MODES = ("process", "children", "wait")
KILL_AFTER_S = 30.0
"""After the SIGINT, seconds the service gets to drain before SIGKILL (its group)."""


class StepShim:
    """The service process, and when it was asked to stop (None: not yet)."""

    def __init__(
        self, command: list[str], exit_file: Path, stop_file: Path, stop: str = "process"
    ) -> None:
        if stop not in STOP_MODES:
            raise ValueError(f"--stop must be one of {STOP_MODES}, got {stop!r}")
        self.exit_file, self.stop_file, self.stop_mode = exit_file, stop_file, stop
        self.command = command
        self.stop_sent_at: float | None = None
        self.child: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Starts the service in its own process group, the held signals blocked in it."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:  # the child inherits the mask; this process takes the signals again below
            self.child = subprocess.Popen(self.command, start_new_session=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def on_held_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM / SIGUSR1: the job should stop; the coordinator saves first."""
        print(f"slurm_step: {signal.Signals(signum).name}: asking the job to stop", flush=True)
        self.stop_file.parent.mkdir(parents=True, exist_ok=True)
        self.stop_file.touch()

    def on_int(self, signum: int, frame: FrameType | None) -> None:
        self.stop_sent_at = self.stop_sent_at or time.monotonic()
        self._signal_group(signal.SIGINT)

    def stop(self) -> None:
        """SIGINT to what ``--stop`` names (once); SIGINT to the shim itself, though, means
        now: the whole process group."""
        if self.stop_sent_at is not None or self.child is None:
            return
        self.stop_sent_at = time.monotonic()
        if self.stop_mode == "process":
            _signal(self.child.pid, signal.SIGINT)
        elif self.stop_mode == "children":
            for pid in child_pids(self.child.pid):
                _signal(pid, signal.SIGINT)

    def run(self) -> int:
        """Waits for the service, stopping it once the exit file is there; its exit code."""
        assert self.child is not None, "start() first"
        while True:
            try:
                code = self.child.wait(POLL_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                self._signal_group(signal.SIGKILL)  # stragglers it left in its group
                return code
            now = time.monotonic()
            if self.stop_sent_at is None and self.exit_file.exists():
                self.stop()
            elif self.stop_sent_at is not None and now - self.stop_sent_at > KILL_AFTER_S:
                self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        if self.child is None:
            return
        try:
            os.killpg(self.child.pid, sig)
        except ProcessLookupError:
            pass


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (Linux /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridflow-slurm-step", description=__doc__)
    parser.add_argument("--exit-file", required=True, help="written when the coordinator exits")
    parser.add_argument("--stop-file", required=True, help="created on SIGTERM / SIGUSR1")
    parser.add_argument(
        "--stop",
        choices=STOP_MODES,
        default="process",
        help="what gets SIGINT once the exit file is there (module docstring)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the service's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no service command after --")
    shim = StepShim(command, Path(args.exit_file), Path(args.stop_file), args.stop)
    for sig in HELD_SIGNALS:
        signal.signal(sig, shim.on_held_signal)
    signal.signal(signal.SIGINT, shim.on_int)
    shim.start()
    return shim.run()


if __name__ == "__main__":
    sys.exit(main())
