"""The launcher and the environment service: started (and its address handed to the
coordinator) only when ``environment.envs`` lists a class, so existing jobs launch as before;
restarted like the reward service when it dies; its classes and port checked by preflight."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

from hybridflow.deploy.launcher import ServiceGroup, ServiceProcess
from hybridflow.deploy.preflight import problems
from hybridflow.deploy.supervisor import EventLog, Outcome, Supervisor
from hybridflow.job_config import JobConfig, load_job_config
from tests.unit.deploy.fakes import FakeGroup, Script, child, exit_with

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "deploy" / "configs" / "quickstart.yaml"
ENV_CLASS = "tests.unit.envs.test_environment_service:Guess"


def started_commands(tmp_path: Path, overrides: list[str]) -> dict[str, str]:
    """Service name → the command line ``ServiceGroup.start`` ran, with a fake python that
    only prints its arguments."""
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    job = load_job_config(QUICKSTART, overrides)
    group = ServiceGroup(job, str(QUICKSTART), overrides, tmp_path, python=str(fake))
    try:
        group.start()
        for proc in group.processes:
            proc.popen.wait(timeout=30)
        return {p.name: p.log_path.read_text().strip() for p in group.processes}
    finally:
        group.stop(grace_s=5)


def test_a_job_without_envs_starts_exactly_the_services_it_did(tmp_path: Path) -> None:
    assert list(started_commands(tmp_path, [])) == ["reward", "learner", "rollout0"]


def test_a_job_with_envs_starts_the_environment_service(tmp_path: Path) -> None:
    commands = started_commands(
        tmp_path, [f"environment.envs=[{ENV_CLASS}]", f"coordinator.multi_turn.env={ENV_CLASS}"]
    )
    assert list(commands) == ["reward", "environment", "learner", "rollout0"]
    assert commands["environment"].startswith("-m hybridflow.main.environment --config")
    assert commands["environment"].endswith(f"--port-file {tmp_path / 'environment.addr'}")


def _group_with(tmp_path: Path, names: list[str]) -> ServiceGroup:
    job = JobConfig()
    if "environment" in names:
        job.environment.envs = [ENV_CLASS]
    group = ServiceGroup(job, None, [], tmp_path)
    for i, name in enumerate(names):
        proc = ServiceProcess(name, None, tmp_path / "a", tmp_path / "l", f"127.0.0.1:{4000 + i}")  # type: ignore[arg-type]
        group.processes.append(proc)
    return group


def test_the_coordinator_learns_the_environment_address_only_when_there_is_one(
    tmp_path: Path,
) -> None:
    without = _group_with(tmp_path, ["reward", "learner", "rollout0"]).address_overrides()
    assert not any("environment" in o for o in without)
    overrides = _group_with(
        tmp_path, ["reward", "environment", "learner", "rollout0"]
    ).address_overrides()
    assert "coordinator.environment_address=127.0.0.1:4001" in overrides
    job = load_job_config(QUICKSTART, overrides)  # what the coordinator loads from stdin
    assert job.coordinator.environment_address == "127.0.0.1:4001"


def test_a_dead_environment_service_is_restarted_and_the_run_goes_on(tmp_path: Path) -> None:
    group = FakeGroup(tmp_path)
    for name in ("reward", "environment", "learner", "rollout0"):
        group.add(name)
    coordinator = child()
    script = Script()
    sup = Supervisor(
        group,
        coordinator,
        EventLog(tmp_path / "supervisor.jsonl", wall_clock=script.clock),
        clock=script.clock,
        sleep=script.sleep,
    )
    try:
        script.at(1.0, lambda: exit_with(group.get("environment").popen, 9))
        script.at(20.0, lambda: exit_with(coordinator, 0))
        assert sup.run() == Outcome(0)
        assert group.restarts == ["environment"]
    finally:
        group.close()


def test_preflight_names_an_environment_class_that_does_not_load() -> None:
    found = problems(
        QUICKSTART,
        [
            "environment.envs=[tests.no_such_module:Env]",
            "coordinator.multi_turn.env=tests.no_such_module:Env",
        ],
    )
    assert len(found) == 1
    assert found[0].startswith("config error: environment.envs[0]: ")
    assert "tests.no_such_module" in found[0]
    assert (
        problems(
            QUICKSTART,
            [f"environment.envs=[{ENV_CLASS}]", f"coordinator.multi_turn.env={ENV_CLASS}"],
        )
        == []
    )


def test_preflight_checks_the_environment_port_only_when_the_service_runs() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    shared = [f"environment.server.port={port}", f"reward.server.port={port}"]
    assert problems(QUICKSTART, shared) == []  # no envs: no environment service, no clash
    found = problems(
        QUICKSTART,
        [*shared, f"environment.envs=[{ENV_CLASS}]", f"coordinator.multi_turn.env={ENV_CLASS}"],
    )
    assert (
        f"config error: environment.server.port: {port} on 127.0.0.1 is also reward.server.port"
        in found
    )
