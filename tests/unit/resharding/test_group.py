"""Weight-sync group helpers in one process: the plan-hash check and input validation."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hybridflow.models.families import DecoderDims
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.plan import make_plan
from hybridflow.weights.transport.group import check_plan_hash, init_weight_sync_group
from hybridflow.weights.transport.reference import allocate_destination, fsdp_shards
from hybridflow.weights.transport.replay import check_destination, check_source_shards

TOPO = decoder_topology(DecoderDims(8, 12, 2, 1, 4, 10, 1, True, "float32"))


def test_plan_hash_check_passes_then_names_the_mismatching_rank() -> None:
    group = init_weight_sync_group("127.0.0.1", 0, 1, 0, "gloo", 10.0, local_addr="127.0.0.1")
    check_plan_hash(group, "aaaa")  # a single rank agrees with itself
    # A two-rank view of the same store where rank 1 published a different plan.
    pair = dataclasses.replace(group, world_size=2)
    pair.store.set("plan_hash/next/1", "bbbb")
    with pytest.raises(RuntimeError, match=r"ranks \[1\] have \['bbbb'\]"):
        check_plan_hash(pair, "aaaa", tag="next")
    group.close()


def test_a_plan_hash_mismatch_names_the_parameters_the_plans_disagree_on() -> None:
    group = init_weight_sync_group("127.0.0.1", 0, 1, 0, "gloo", 10.0, local_addr="127.0.0.1")
    pair = dataclasses.replace(group, world_size=2)
    pair.store.set("plan_params/p/1", json.dumps({"a.weight": [4, 3]}))
    pair.store.set("plan_hash/p/1", "bbbb")
    mine = {"a.weight": (4, 3), "a.bias": (4,)}
    with pytest.raises(RuntimeError, match=r"only rank 0's plan has 'a\.bias'"):
        check_plan_hash(pair, "aaaa", tag="p", params=mine)
    group.close()


def test_init_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="backend"):
        init_weight_sync_group("127.0.0.1", 0, 1, 0, "mpi")
    with pytest.raises(ValueError, match="rank"):
        init_weight_sync_group("127.0.0.1", 0, 2, 2)


def test_executor_inputs_are_checked_by_name() -> None:
    plan = make_plan(TOPO, 2, [2], 1024)
    full = {p.name: torch.zeros(p.shape) for p in TOPO.params}
    shards = fsdp_shards(TOPO, full, 2, 1)
    check_source_shards(plan, 1, shards)
    shards["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"model.norm.weight on source rank 1 is \(3,\)"):
        check_source_shards(plan, 1, shards)
    out = allocate_destination(plan, 0, 1)
    check_destination(plan, 0, 1, out)
    out["model.embed_tokens.weight"] = torch.zeros(10, 8)
    with pytest.raises(ValueError, match="out: model.embed_tokens.weight"):
        check_destination(plan, 0, 1, out)
