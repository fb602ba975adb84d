"""The Slurm plan: node-list expansion, placement on a 3-node allocation, and the sbatch
script's dry run (prints the plan, starts nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.deploy.slurm import expand_nodelist, main, plan_job
from hybridflow.job_config import load_job_config

REPO = Path(__file__).resolve().parents[3]
CONFIG = "deploy/configs/quickstart.yaml"


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a1,b[8-10],c", ["a1", "b8", "b9", "b10", "c"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu[01-02]-ib", ["gpu01-ib", "gpu02-ib"]),
        ("solo", ["solo"]),
    ],
)
def test_expand_nodelist(nodelist, names):
    assert expand_nodelist(nodelist) == names


@pytest.mark.parametrize("bad", ["gpu[01-03", "gpu01-03]", "gpu[03-01]", "gpu[a-b]", "a,,b", ""])
def test_expand_nodelist_refuses_malformed_lists(bad):
    with pytest.raises(ValueError):
        expand_nodelist(bad)


RUN = Path("/shared/runs/slurm-7")


def steps_by_name(
    nodelist: str,
    overrides: list[str],
    learner_nodes: int = 1,
    addresses: dict[str, str] | None = None,
    resume: bool = False,
) -> dict:
    job = load_job_config(REPO / CONFIG, overrides)
    nodes = expand_nodelist(nodelist)
    steps = plan_job(
        nodes, job, ["--config", CONFIG], learner_nodes, "python", addresses, RUN, resume
    )
    return {s.name: s for s in steps}


def test_three_nodes_learner_rollout_reward_one_each():
    steps = steps_by_name("gpu[01-03]", [])
    assert list(steps) == ["learner0", "rollout0", "reward", "coordinator"]
    assert [steps[n].node for n in steps] == ["gpu01", "gpu02", "gpu03", "gpu01"]
    assert steps["learner0"].address == "gpu01:50051"
    assert steps["rollout0"].address == "gpu02:50100"
    assert steps["reward"].address == "gpu03:50052"
    learner = steps["learner0"].command
    assert learner[:5] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu01", "--overlap"]
    # one rank on one node: no torchrun
    assert "hybridflow.main.learner" in learner and "torch.distributed.run" not in learner
    for name in ("learner0", "rollout0", "reward"):
        command = steps[name].command
        role = name.rstrip("0")
        assert f"{role}.server.host=0.0.0.0" in command
        assert f"--output={RUN}/logs/{name}.log" in command
        # under the shim that holds Slurm's SIGTERM until the coordinator has exited
        shim = command.index("hybridflow.deploy.slurm_step")
        assert f"--exit-file={RUN}/slurm/coordinator.exit" in command[shim:]
        assert command[command.index("--", shim) + 1] == "python"
        assert "--stop=process" in command[shim:]  # SIGINT to the service's process
        assert f"learner.checkpoint_dir={RUN}/checkpoints" in command
    coordinator = steps["coordinator"].command
    assert coordinator[:6] == [
        "python",
        "-m",
        "hybridflow.main.coordinator",
        "run",
        "--run-dir",
        str(RUN),
    ]
    assert "--resume" not in coordinator
    assert "coordinator.rollout_addresses=[gpu02:50100]" in coordinator
    assert "coordinator.reward_address=gpu03:50052" in coordinator
    assert "coordinator.learner_address=gpu01:50051" in coordinator
    assert "weight_sync.allowed_hosts=[gpu01,gpu02]" in coordinator
    assert "weight_sync.store_host=gpu01" in coordinator


def test_services_are_dialled_at_their_node_addresses():
    addresses = {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2", "gpu03": "10.0.0.3"}
    steps = steps_by_name("gpu[01-03]", [], addresses=addresses, resume=True)
    assert [steps[n].address for n in ("learner0", "rollout0", "reward")] == [
        "10.0.0.1:50051", "10.0.0.2:50100", "10.0.0.3:50052",
    ]  # fmt: skip
    assert "--nodelist=gpu02" in steps["rollout0"].command  # srun places by name
    coordinator = steps["coordinator"].command
    assert "--resume" in coordinator
    assert "coordinator.rollout_addresses=[10.0.0.2:50100]" in coordinator
    assert "coordinator.learner_address=10.0.0.1:50051" in coordinator
    assert "weight_sync.allowed_hosts=[10.0.0.1,10.0.0.2]" in coordinator
    assert "weight_sync.store_host=10.0.0.1" in coordinator


def test_two_learner_nodes_and_replicas_sharing_a_node():
    overrides = ["rollout.replicas=3", "learner.topology.nproc_per_node=4"]
    addresses = {f"gpu0{i}": f"10.0.0.{i}" for i in range(1, 6)}
    steps = steps_by_name("gpu[01-05]", overrides, learner_nodes=2, addresses=addresses)
    assert [steps[f"learner{r}"].node for r in (0, 1)] == ["gpu01", "gpu02"]
    learner1 = steps["learner1"].command
    for arg in ("--nnodes=2", "--node-rank=1", "--nproc-per-node=4",
                "--rdzv-endpoint=10.0.0.1:29500", "--local-addr=10.0.0.2"):  # fmt: skip
        assert arg in learner1, arg
    assert "learner.topology.node_rank=1" in learner1  # the service reads it too
    assert "--rdzv-conf=is_host=1" in steps["learner0"].command  # node 0 hosts the store
    # rank 0's node stops torchrun's ranks (rank 0 relays the shutdown); the others wait
    assert "--stop=children" in steps["learner0"].command
    assert "--stop=wait" in learner1
    assert steps["learner1"].address == ""  # only rank 0 serves gRPC
    # gpu03 and gpu04 take the replicas round-robin (ports base + index), gpu05 the reward
    rollouts = [steps[f"rollout{i}"].address for i in range(3)]
    assert rollouts == ["10.0.0.3:50100", "10.0.0.4:50101", "10.0.0.3:50102"]
    assert steps["reward"].node == "gpu05"
    assert f"coordinator.rollout_addresses=[{','.join(rollouts)}]" in steps["coordinator"].command


def test_one_node_holds_everything():
    steps = steps_by_name("solo", [])
    assert {s.node for s in steps.values()} == {"solo"}


def test_more_learner_nodes_than_the_allocation_is_refused():
    job = load_job_config(REPO / CONFIG)
    with pytest.raises(ValueError, match="--learner-nodes"):
        plan_job(["a", "b"], job, [], learner_nodes=3)


def test_sbatch_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    env = {
        **os.environ,
        "SLURM_JOB_NODELIST": "gpu[01-03]",
        "HYBRIDFLOW_DRY_RUN": "1",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "PATH": str(tmp_path),  # no srun here: a real run would fail to start it
    }
    env.pop("SLURM_SUBMIT_DIR", None)
    out = subprocess.run(
        ["/bin/bash", str(REPO / "deploy/slurm/hybridflow.sbatch"), "--config", CONFIG],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert [line.split(":", 1)[0] for line in out] == [
        "learner0 on gpu01 -> gpu01",
        "rollout0 on gpu02 -> gpu02",
        "reward on gpu03 -> gpu03",
        "coordinator on gpu01",
    ]
    assert "--set weight_sync.transport=grpc" in out[-1]
    assert "'coordinator.rollout_addresses=[gpu02:50100]'" in out[-1]


def _dry_run(argv: list[str], capsys, monkeypatch, tmp_path: Path, **env: str) -> list[str]:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no scontrol: names are addresses
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = main(["--nodelist", "n[1-3]", "--config", str(REPO / CONFIG), "--dry-run", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out.splitlines()


def test_resume_auto_resumes_only_a_run_dir_with_an_earlier_start(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    argv = ["--run-dir", str(run_dir), "--resume", "auto"]
    assert "--resume" not in _dry_run(argv, capsys, monkeypatch, tmp_path)[-1].split()
    (run_dir / "checkpoints" / "step_00000010").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000010" / "coordinator.json").write_text("{}")
    assert "--resume" in _dry_run(argv, capsys, monkeypatch, tmp_path)[-1].split()
    assert not (run_dir / "slurm").exists()  # a dry run writes nothing


def test_the_run_dir_is_named_by_the_job_and_array_task(tmp_path, capsys, monkeypatch):
    root = ["--set", f"deploy.run_root={tmp_path}"]
    plan = _dry_run(root, capsys, monkeypatch, tmp_path, SLURM_JOB_ID="41")
    assert f"--run-dir {tmp_path}/slurm-41 " in plan[-1]
    sweep = [*root, "--sweep", "learner.optimizer.lr=0.001,0.002"]
    array = {"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "42", "SLURM_ARRAY_TASK_ID": "1"}
    plan = _dry_run(sweep, capsys, monkeypatch, tmp_path, **array)
    assert f"--run-dir {tmp_path}/slurm-42_1 " in plan[-1]
    assert "--set learner.optimizer.lr=0.002" in plan[-1]


def test_a_sweep_outside_an_array_or_past_its_values_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    argv = ["--nodelist", "n[1-3]", "--dry-run", "--sweep", "coordinator.seed=1,2"]
    assert main(argv) == 2
    assert "needs a job array task" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert main(argv) == 2
    assert "array task 2 has no value (2 given: --array=0-1)" in capsys.readouterr().err


def test_configured_devices_reach_each_steps_service():
    overrides = [
        "rollout.replicas=2",
        "rollout.devices=['0','1']",
        "learner.topology.devices=['2','3']",
    ]
    steps = steps_by_name("gpu[01-02]", overrides)
    for name, devices in (("learner0", "2,3"), ("rollout0", "0"), ("rollout1", "1")):
        command = steps[name].command
        at = command.index("--")  # the shim's end: the service's command starts here
        assert command[at + 1 : at + 3] == ["env", f"CUDA_VISIBLE_DEVICES={devices}"], name


def test_a_multi_turn_job_runs_its_environment_service_as_its_own_step():
    # As deploy/launch.sh does: environment.envs lists a class, so the episodes step in the
    # environment service (on the reward's node), and the coordinator is pointed at it rather
    # than running the user's environment classes in its own process.
    job = load_job_config(REPO / "deploy/configs/guess-number.yaml", [])
    assert job.environment.enabled
    nodes = expand_nodelist("cpu[1-3]")
    steps = {
        s.name: s
        for s in plan_job(nodes, job, ["--config", "deploy/configs/guess-number.yaml"], run_dir=RUN)
    }
    assert list(steps) == ["learner0", "rollout0", "reward", "environment", "coordinator"]
    environment = steps["environment"]
    assert (environment.node, environment.address) == ("cpu3", "cpu3:50053")
    command = environment.command
    assert command[command.index("--", command.index("hybridflow.deploy.slurm_step")) + 1 :][
        :3
    ] == ["python", "-m", "hybridflow.main.environment"]
    assert "environment.server.host=0.0.0.0" in command
    assert "environment.server.port=50053" in command
    assert f"--output={RUN}/logs/environment.log" in command
    assert "coordinator.environment_address=cpu3:50053" in steps["coordinator"].command
    # A single-turn job has none.
    assert "environment" not in steps_by_name("cpu[1-3]", [])
    assert not any(
        "environment_address" in a for a in steps_by_name("cpu[1-3]", [])["coordinator"].command
    )
