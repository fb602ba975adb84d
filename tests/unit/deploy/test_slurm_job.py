"""run_plan without Slurm: a service under the shim and a fake coordinator; a stop request
reaches the coordinator once, only when it is ready, and the service stops after it."""

from __future__ import annotations

import signal
import sys

from hybridflow.deploy.slurm_job import StopRequests, control_files, run_plan
from hybridflow.deploy.slurm_plan import Step

# A coordinator: ready once it writes coordinator.addr; a SIGINT makes it "save" and exit.
COORDINATOR = """
import signal, sys, time
from pathlib import Path
run = Path(sys.argv[1])
def on_int(sig, frame):
    (run / "saved").write_text("yes")
    sys.exit(0)
signal.signal(signal.SIGINT, on_int)
(run / "coordinator.addr").write_text("127.0.0.1:1")
(run / "slurm" / "stop").touch()  # as a shim does when its step gets SIGTERM
while True:
    time.sleep(0.05)
"""
SERVICE = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, lambda *_: (Path(sys.argv[1]).write_text("stopped"), sys.exit(0)))
while True:
    time.sleep(0.05)
"""


def test_a_stop_request_saves_then_the_services_stop(tmp_path):
    exit_file, stop_file = control_files(tmp_path)
    service = [
        sys.executable, "-m", "hybridflow.deploy.slurm_step",
        f"--exit-file={exit_file}", f"--stop-file={stop_file}", "--",
        sys.executable, "-c", SERVICE, str(tmp_path / "service"),
    ]  # fmt: skip
    coordinator = [sys.executable, "-c", COORDINATOR, str(tmp_path)]
    steps = [Step("reward", "n1", service), Step("coordinator", "n1", coordinator)]
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        assert run_plan(steps, tmp_path) == 0
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert (tmp_path / "saved").read_text() == "yes"
    assert exit_file.read_text() == "0\n"
    assert (tmp_path / "service").read_text() == "stopped"
    assert (tmp_path / "slurm" / "plan.txt").read_text().startswith("reward on n1: ")


class _FakeCoordinator:
    def __init__(self) -> None:
        self.signals: list[int] = []

    def poll(self) -> None:
        return None

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


def test_one_sigint_however_many_requests_and_none_before_ready(tmp_path):
    requests = StopRequests(tmp_path / "stop", tmp_path / "ready")
    fake = _FakeCoordinator()
    requests.coordinator = fake  # type: ignore[assignment]
    requests.on_signal(signal.SIGTERM, None)
    (tmp_path / "stop").touch()
    requests.poll()
    assert fake.signals == []  # its handlers may not be there yet
    (tmp_path / "ready").touch()
    requests.poll()
    requests.on_signal(signal.SIGUSR1, None)
    assert fake.signals == [signal.SIGINT]


def test_no_request_no_signal(tmp_path):
    requests = StopRequests(tmp_path / "stop", tmp_path / "ready")
    fake = _FakeCoordinator()
    requests.coordinator = fake  # type: ignore[assignment]
    (tmp_path / "ready").touch()
    requests.poll()
    assert fake.signals == []
