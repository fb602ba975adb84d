"""The launcher's ``main`` on the paths that end before or during the start: each refusal is
one line and exit 2 with nothing recorded, a failed start exits 1 and a signal while starting
130, both stopping the coordinator and then the services; the signal handler's phases and the
closing lines (issue 21: the entry point in parts, behaviour unchanged)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hybridflow.deploy.launch import _report, _Run, main
from hybridflow.deploy.supervisor import Outcome

from .test_launch_args import CONFIG


@pytest.fixture(autouse=True)
def keep_process_state():  # type: ignore[no-untyped-def]
    """The launcher sets the umask and SIGINT / SIGTERM handlers; the test process gets its
    own back."""
    old_umask = os.umask(0o022)
    os.umask(old_umask)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    os.umask(old_umask)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_an_unknown_flag_is_argparse_usage_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--bogus"])
    assert exit_.value.code == 2
    assert stderr_lines(capsys)[-1] == "deploy/launch.sh: error: unrecognized arguments: --bogus"


def test_resume_and_run_dir_together_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["--resume", str(tmp_path / "a"), "--run-dir", str(tmp_path / "b")]
    assert main(argv) == 2
    assert stderr_lines(capsys) == ["error: give --resume RUN_DIR or --run-dir, not both"]


def test_a_config_error_names_the_key_and_creates_no_run_dir(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["--config", CONFIG, "--set", "coordinator.nope=1", "--run-dir", str(run_dir)]) == 2
    err = stderr_lines(capsys)
    assert len(err) == 1 and err[0].startswith("config error: unknown key 'coordinator.nope'")
    assert not run_dir.exists()


def test_resume_auto_with_a_config_error_names_the_key(tmp_path, capsys):
    """``--resume auto`` loads the config to find the run root: its errors are the usual
    config lines and exit 2 (this once crashed with an UnboundLocalError)."""
    assert main(["--resume", "auto", "--config", CONFIG, "--set", "bogus.key=1"]) == 2
    err = stderr_lines(capsys)
    assert len(err) == 1 and err[0].startswith("config error: unknown key 'bogus'")


def test_a_token_file_others_can_read_is_refused_before_launch_json(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "token").write_text("x\n")
    os.chmod(run_dir / "token", 0o644)
    assert main(["--config", CONFIG, "--run-dir", str(run_dir)]) == 2
    err = stderr_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error: ") and "not a private" in err[0], err
    assert not (run_dir / "launch.json").exists()


class FakeGroup:
    """Stands in for ServiceGroup: starts nothing; ``wait_ready`` runs ``on_wait``."""

    instances: list[FakeGroup] = []
    on_wait: Any = None

    def __init__(self, job: Any, config_path: str, overrides: list[str], run_dir: Path, env: Any):
        self.processes: list[Any] = []
        self.kill_now = False
        self.calls: list[str] = []
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.coordinator_code_at_stop: int | None = None
        FakeGroup.instances.append(self)

    def start(self) -> None:
        self.calls.append("start")

    def wait_ready(self, timeout_s: float, watch: list[tuple[str, Any]]) -> dict[str, str]:
        self.calls.append("wait_ready")
        self.coordinator = watch[0][1]
        FakeGroup.on_wait()
        return {}

    def stop(self) -> None:
        self.calls.append("stop")
        assert self.coordinator is not None
        self.coordinator_code_at_stop = self.coordinator.poll()


@pytest.fixture
def fake_group(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr("hybridflow.deploy.launcher.ServiceGroup", FakeGroup)
    monkeypatch.setenv("HYBRIDFLOW_TOKEN", "test")
    FakeGroup.instances = []
    yield FakeGroup
    for group in FakeGroup.instances:  # a failed assertion must not leave a coordinator
        if group.coordinator is not None and group.coordinator.poll() is None:
            group.coordinator.kill()
            group.coordinator.wait()


def _fail_start() -> None:
    raise RuntimeError("reward exited with code 1 before serving")


def _signal_while_starting() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # the handler's KeyboardInterrupt ends this at once


@pytest.mark.parametrize(
    ("on_wait", "code", "message"),
    [
        (_fail_start, 1, "reward exited with code 1 before serving"),
        (_signal_while_starting, 130, "interrupted before the services were ready"),
    ],
)
def test_a_start_that_ends_stops_the_coordinator_then_the_services(
    tmp_path, fake_group, caplog, on_wait, code, message
):
    fake_group.on_wait = on_wait
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="launch"):
        assert main(["--config", CONFIG, "--run-dir", str(run_dir)]) == code
    (group,) = fake_group.instances
    assert group.calls == ["start", "wait_ready", "stop"]
    assert group.coordinator_code_at_stop is not None  # stopped before the services
    assert message in caplog.text
    assert (run_dir / "launch.json").is_file() and not (run_dir / "service_usage.json").exists()


class FakeSupervisor:
    num_stop_requests = 0

    def request_stop(self) -> None:
        self.num_stop_requests += 1


def test_the_signal_handler_aborts_a_start_then_stops_then_kills():
    group = SimpleNamespace(kill_now=False)
    run = _Run(group)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        run.on_signal(signal.SIGTERM, None)
    assert run.phase == "stopping" and not group.kill_now
    run.on_signal(signal.SIGTERM, None)  # while stopping: kill what is left now
    assert group.kill_now

    group.kill_now = False
    run.supervisor = FakeSupervisor()  # type: ignore[assignment]
    run.phase = "running"
    run.on_signal(signal.SIGINT, None)  # the first: a graceful stop
    assert run.supervisor.num_stop_requests == 1 and not group.kill_now
    run.on_signal(signal.SIGINT, None)  # the second: kill
    assert run.supervisor.num_stop_requests == 2 and group.kill_now


def test_the_closing_line_names_the_cause_or_the_stop_with_the_resume_command(tmp_path, capsys):
    hint = f"resume with: deploy/launch.sh --resume {tmp_path}"
    assert _report(Outcome(code=0), tmp_path) == 0
    assert stderr_lines(capsys) == []
    assert _report(Outcome(code=-9, cause="learner exited with -9"), tmp_path) == 1
    assert stderr_lines(capsys) == [f"learner exited with -9; {hint}"]
    assert _report(Outcome(code=0, stopped_by_request=True), tmp_path) == 0
    assert stderr_lines(capsys) == [f"stopped on request; {hint}"]
