"""The launcher's run-dir bookkeeping: the 0600 per-run token, launch.json and --resume,
and the command a restarted service gets (pinned to its old port)."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from hybridflow.deploy.launch import (
    LaunchError,
    _run_token_env,
    build_parser,
    resolve_launch,
    write_launch_record,
)
from hybridflow.deploy.launcher import ServiceGroup, ServiceProcess
from hybridflow.job_config import JobConfig
from tests.helpers import learner_config

CONFIG = "deploy/configs/quickstart.yaml"


def test_token_file_is_0600_and_reused(tmp_path, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    env = _run_token_env(tmp_path)
    token = env["HYBRIDFLOW_TOKEN"]
    assert len(token) >= 32
    assert stat.S_IMODE((tmp_path / "token").stat().st_mode) == 0o600
    assert (tmp_path / "token").read_text().strip() == token
    assert _run_token_env(tmp_path) == env  # resume: same token


def test_token_from_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_TOKEN", "own")
    assert _run_token_env(tmp_path) == {}
    assert not (tmp_path / "token").exists()


def test_token_file_readable_by_others_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    (tmp_path / "token").write_text("x\n")
    os.chmod(tmp_path / "token", 0o644)
    with pytest.raises(LaunchError, match="not a private regular file"):
        _run_token_env(tmp_path)


def args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(list(argv))


def previous_run(run_dir: Path, overrides: list[str]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("model: builtin:tiny\n")
    write_launch_record(run_dir, CONFIG, overrides, resume=False)
    return run_dir


def test_resume_repeats_the_first_launch_plus_extra_overrides(tmp_path):
    run = previous_run(tmp_path / "a", ["coordinator.num_steps=5"])
    config, overrides, run_dir = resolve_launch(
        args("--resume", str(run), "--set", "coordinator.num_steps=9")
    )
    assert (config, run_dir) == (CONFIG, run)
    assert overrides == ["coordinator.num_steps=5", "coordinator.num_steps=9"]
    write_launch_record(run, config, overrides, resume=True)
    record = json.loads((run / "launch.json").read_text())
    assert record["overrides"] == overrides
    assert [entry["resume"] for entry in record["launches"]] == [False, True]


def test_resume_refuses_another_config_a_run_dir_and_a_dir_never_started(tmp_path):
    run = previous_run(tmp_path / "a", [])
    with pytest.raises(LaunchError, match="was launched with --config"):
        resolve_launch(args("--resume", str(run), "--config", "other.yaml"))
    with pytest.raises(LaunchError, match="not both"):
        resolve_launch(args("--resume", str(run), "--run-dir", str(run)))
    with pytest.raises(LaunchError, match="not a directory"):
        resolve_launch(args("--resume", str(tmp_path / "missing")))
    (run / "config.yaml").unlink()
    with pytest.raises(LaunchError, match="config.yaml not found"):
        resolve_launch(args("--resume", str(run)))


def test_a_fresh_launch_into_a_started_run_is_refused_pointing_at_resume(tmp_path):
    """It used to train from step 1 and then fail on the first checkpoint name it reused."""
    run = previous_run(tmp_path / "a", [])
    with pytest.raises(LaunchError, match=rf"already holds a run .* --resume {run}"):
        resolve_launch(args("--run-dir", str(run)))
    (run / "config.yaml").unlink()  # a launch that never got to its coordinator
    assert resolve_launch(args("--run-dir", str(run)))[2] == run


def test_resume_auto_picks_the_run_launched_last(tmp_path):
    older = previous_run(tmp_path / "runs" / "b_older", [])
    newer = previous_run(tmp_path / "runs" / "a_newer", [])
    past = time.time() - 100
    os.utime(older / "launch.json", (past, past))
    _, _, run_dir = resolve_launch(
        args("--resume", "auto", "--set", f"deploy.run_root={tmp_path / 'runs'}")
    )
    assert run_dir == newer
    with pytest.raises(LaunchError, match="no run"):
        resolve_launch(args("--resume", "auto", "--set", f"deploy.run_root={tmp_path / 'none'}"))


# Prints its argv and exits: stands in for a service so the restart command can be read.
ECHO = "import json, sys; print(json.dumps(sys.argv[1:]))"


@pytest.mark.parametrize(
    ("name", "address", "pin"),
    [
        ("reward", "127.0.0.1:41000", "reward.server.port=41000"),
        ("environment", "127.0.0.1:41003", "environment.server.port=41003"),
        ("rollout2", "127.0.0.1:41002", "rollout.server.port=41000"),  # base + replica index
    ],
)
def test_restart_pins_the_old_port_and_passes_the_env(tmp_path, name, address, pin):
    job = JobConfig()  # a plan with an environment service and three replicas
    job.environment.envs, job.rollout.replicas = ["tests.unit.envs:Any"], 3
    group = ServiceGroup(job, CONFIG, ["coordinator.num_steps=3"], tmp_path, env={"HF_TEST_X": "1"})
    cmd = [sys.executable, "-c", ECHO + "; import os; print(os.environ['HF_TEST_X'])"]
    old = ServiceProcess(name, None, tmp_path / "x.addr", tmp_path / "x.log", address, cmd)  # type: ignore[arg-type]
    group.processes.append(old)
    new = group.restart(old)
    assert new.popen.wait(timeout=30) == 0
    assert group.processes == [new] and new.address == address
    printed = new.log_path.read_text().splitlines()
    argv = json.loads(printed[-2])
    assert argv == [
        "--config",
        CONFIG,
        "--set",
        "coordinator.num_steps=3",
        "--set",
        pin,
        "--port-file",
        str(tmp_path / f"{name}.addr"),
    ]
    assert printed[-1] == "1"


def test_learner_cannot_be_restarted(tmp_path):
    group = ServiceGroup(JobConfig(), CONFIG, [], tmp_path)
    proc = ServiceProcess("learner", None, tmp_path / "a", tmp_path / "l", "127.0.0.1:1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot be restarted"):
        group.restart(proc)


def test_learner_ranks_include_the_critic_ranks_and_their_devices(tmp_path, monkeypatch):
    from hybridflow.job.plan import ranks_command
    from hybridflow.services.learner.config import LearnerConfig

    learner = learner_config(
        algorithm="ppo",
        topology={
            "device": "cuda",
            "nproc_per_node": 2,
            "devices": ["0", "1"],
            "critic_nproc_per_node": 1,
            "critic_devices": ["5"],
        },
    )
    cmd = ranks_command("py", "hybridflow.main.learner", learner)
    assert "--nproc-per-node=3" in cmd and cmd[-2:] == ["-m", "hybridflow.main.learner"]
    one_plus_one = learner_config(algorithm="ppo", topology={"critic_nproc_per_node": 1})
    assert "--nproc-per-node=2" in ranks_command("py", "m", one_plus_one)
    assert ranks_command("py", "m", LearnerConfig()) == ["py", "-m", "m"]

    group = ServiceGroup(JobConfig(learner=learner), CONFIG, [], tmp_path)
    spawned: dict[str, tuple[list[str], str]] = {}
    monkeypatch.setattr(group.gpu_memory, "start", lambda: None)
    monkeypatch.setattr(
        group,
        "_spawn",
        lambda name, cmd, devices="", spec=None: spawned.setdefault(name, (cmd, devices)),
    )
    group.start()
    # One torchrun for both groups: local ranks 0-1 (actor) see devices 0,1, local rank 2
    # (critic) the third entry, device 5.
    assert spawned["learner"][1] == "0,1,5"
    assert "--nproc-per-node=3" in spawned["learner"][0]


def test_learner_spans_hosts_through_torchrun_rendezvous():
    from hybridflow.job.plan import ranks_command

    node1 = learner_config(
        topology={"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "10.0.0.1:29400"}
    )
    node1.validate()
    assert ranks_command("py", "m", node1) == [
        "py", "-m", "hybridflow.deploy.lifeline", "torch.distributed.run",
        "--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400", "--nproc-per-node=1", "-m", "m",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="learner.topology.rdzv_endpoint: host:port"):
        learner_config(topology={"nnodes": 2}).validate()
    with pytest.raises(ValueError, match=r"learner.topology.node_rank must be in \[0, 1\]"):
        learner_config(topology={"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}).validate()
