"""What the batch step reads of its allocation: NodeAddr from scontrol, checkpoints, sweeps."""

from __future__ import annotations

import pytest

from hybridflow.deploy.slurm_allocation import (
    has_earlier_start,
    parse_node_addresses,
    sweep_override,
)

SCONTROL = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.78.0.11 NodeHostName=node1 "
    "State=ALLOCATED\n"
    "NodeName=node2 Arch=x86_64 NodeAddr=ib-node2 NodeHostName=node2 State=IDLE\n"
)


def test_node_addresses_are_scontrols_nodeaddr():
    assert parse_node_addresses(SCONTROL) == {"node1": "10.78.0.11", "node2": "ib-node2"}


def test_an_earlier_start_is_its_config_or_a_checkpoint(tmp_path):
    run, checkpoints = tmp_path / "run", tmp_path / "checkpoints"
    run.mkdir()
    assert not has_earlier_start(run, checkpoints)
    (checkpoints / "step_00000004").mkdir(parents=True)  # cut short before coordinator.json
    assert not has_earlier_start(run, checkpoints)
    (checkpoints / "step_00000004" / "coordinator.json").write_text("{}")
    assert has_earlier_start(run, checkpoints)
    assert has_earlier_start(run, tmp_path / "none") is False
    (run / "config.yaml").write_text("model: x\n")  # its coordinator started, never saved
    assert has_earlier_start(run, tmp_path / "none")


@pytest.mark.parametrize(
    ("task", "override"), [("0", "learner.optimizer.lr=1e-4"), ("2", "learner.optimizer.lr=4e-4")]
)
def test_array_task_i_takes_value_i(task, override):
    sweep = "learner.optimizer.lr=1e-4,2e-4,4e-4"
    assert sweep_override(sweep, {"SLURM_ARRAY_TASK_ID": task}) == override


@pytest.mark.parametrize("bad", ["no-equals", "=1,2", "key="])
def test_a_malformed_sweep_is_refused(bad):
    with pytest.raises(ValueError, match="expected KEY=V0,V1"):
        sweep_override(bad, {"SLURM_ARRAY_TASK_ID": "0"})
