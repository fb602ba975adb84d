"""The Slurm plan: node-list expansion, placement on a 3-node allocation, and the sbatch
script's dry run (prints the plan, starts nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.deploy.slurm import expand_nodelist, plan_job
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


def steps_by_name(nodelist: str, overrides: list[str], learner_nodes: int = 1) -> dict:
    job = load_job_config(REPO / CONFIG, overrides)
    steps = plan_job(expand_nodelist(nodelist), job, ["--config", CONFIG], learner_nodes)
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
    assert "--master-addr=gpu01" in learner and "--node-rank=0" in learner
    for name in ("learner0", "rollout0", "reward"):
        role = name.rstrip("0")
        assert f"{role}.server.host=0.0.0.0" in steps[name].command
    coordinator = steps["coordinator"].command
    assert coordinator[:4] == ["python", "-m", "hybridflow.coordinator", "run"]
    assert "coordinator.rollout_addresses=[gpu02:50100]" in coordinator
    assert "coordinator.reward_address=gpu03:50052" in coordinator
    assert "coordinator.learner_address=gpu01:50051" in coordinator
    assert "weight_sync.allowed_hosts=[gpu02]" in coordinator


def test_two_learner_nodes_and_replicas_sharing_a_node():
    overrides = ["rollout.replicas=3", "learner.topology.nproc_per_node=4"]
    steps = steps_by_name("gpu[01-05]", overrides, learner_nodes=2)
    assert [steps[f"learner{r}"].node for r in (0, 1)] == ["gpu01", "gpu02"]
    assert "--node-rank=1" in steps["learner1"].command
    assert "--nproc-per-node=4" in steps["learner1"].command
    assert steps["learner1"].address == ""  # only rank 0 serves gRPC
    # gpu03 and gpu04 take the replicas round-robin (ports base + index), gpu05 the reward
    rollouts = [steps[f"rollout{i}"].address for i in range(3)]
    assert rollouts == ["gpu03:50100", "gpu04:50101", "gpu03:50102"]
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
