"""The step shim: the service does not see Slurm's SIGTERM, the shim turns it into a stop
request, and the service stops once the coordinator's exit file is there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# A service: records its pid, then the signals it handles; SIGINT ends it (exit 0).
SERVICE = """
import os, signal, sys, time
out = sys.argv[1]
def on(sig, frame):
    open(out, "a").write(f"{signal.Signals(sig).name}\\n")
    if sig == signal.SIGINT:
        sys.exit(0)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, on)
open(out + ".pid", "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def _wait(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _shim(tmp: Path, service: list[str], stop: str = "process") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "hybridflow.deploy.slurm_step", f"--exit-file={tmp / 'exit'}",
         f"--stop-file={tmp / 'stop'}", f"--stop={stop}", "--", *service],
    )  # fmt: skip


def test_sigterm_is_held_from_the_service_and_becomes_a_stop_request(tmp_path):
    record = tmp_path / "record"
    shim = _shim(tmp_path, [sys.executable, "-c", SERVICE, str(record)])
    try:
        _wait(lambda: Path(f"{record}.pid").exists(), "the service")
        service_pid = int(Path(f"{record}.pid").read_text())
        # Slurm signals every process of the step: the shim and the service.
        os.kill(service_pid, signal.SIGTERM)
        shim.send_signal(signal.SIGTERM)
        _wait(lambda: (tmp_path / "stop").exists(), "the stop file")
        assert shim.poll() is None and not record.exists()  # the service saw nothing
        (tmp_path / "exit").write_text("0\n")  # the coordinator has exited
        assert shim.wait(30) == 0
        assert record.read_text().split() == ["SIGINT"]
    finally:
        if shim.poll() is None:
            shim.kill()


def test_the_shim_exits_with_the_services_code(tmp_path):
    shim = _shim(tmp_path, [sys.executable, "-c", "raise SystemExit(3)"])
    assert shim.wait(30) == 3
    assert not (tmp_path / "stop").exists()


# A launcher like torchrun: starts the service as its child; a SIGINT to it is a failure.
LAUNCHER = """
import signal, subprocess, sys
signal.signal(signal.SIGINT, lambda *_: sys.exit(9))
sys.exit(subprocess.call(sys.argv[1:]))
"""


def test_children_mode_stops_the_ranks_not_their_launcher(tmp_path):
    record = tmp_path / "record"
    service = [sys.executable, "-c", SERVICE, str(record)]
    shim = _shim(tmp_path, [sys.executable, "-c", LAUNCHER, *service], stop="children")
    try:
        _wait(lambda: Path(f"{record}.pid").exists(), "the service")
        (tmp_path / "exit").write_text("0\n")
        assert shim.wait(30) == 0  # the launcher saw its child end well, not a SIGINT
        assert record.read_text().split() == ["SIGINT"]
    finally:
        if shim.poll() is None:
            shim.kill()
