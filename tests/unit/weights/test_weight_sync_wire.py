"""Weight-sync wire types: GroupSpec <-> JoinWeightSyncRequest round trip, bad requests named,
and the wire side (spec, publisher interface, config) importing without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.weights.convert import group_spec_from_proto, group_spec_to_proto
from hybridflow.weights.spec import GroupSpec

SPEC = GroupSpec(
    store_host="127.0.0.1",
    store_port=29555,
    group_name="ws3-abcd",
    backend="gloo",
    num_src_ranks=2,
    replica_tp_sizes=(2, 1),
    bucket_bytes=1 << 20,
    executor="planner",
    timeout_s=30.0,
)


def test_group_spec_round_trip() -> None:
    msg = group_spec_to_proto(SPEC, 1)
    assert msg.replica_index == 1
    assert group_spec_from_proto(msg) == SPEC


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("store_port", 0, "store_port"),
        ("backend", "mpi", "backend"),
        ("replica_index", 2, "replica_index"),
        ("num_src_ranks", 0, "num_src_ranks"),
        ("timeout_s", 0.0, "timeout_s"),
    ],
)
def test_bad_join_requests_name_the_field(field: str, value: object, words: str) -> None:
    msg = group_spec_to_proto(SPEC, 0)
    setattr(msg, field, value)
    with pytest.raises(ValueError, match=words):
        group_spec_from_proto(msg)


def test_wire_side_imports_without_torch() -> None:
    code = (
        "import sys, hybridflow.weights, hybridflow.weights.spec, hybridflow.weights.config, "
        "hybridflow.weights.publishers; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_replica_description_round_trip_and_digest_check() -> None:
    from hybridflow.models.families import FAMILIES, DecoderDims
    from hybridflow.resharding.layout import layout_of
    from hybridflow.weights.convert import (
        replica_description_from_proto,
        replica_description_to_proto,
    )
    from hybridflow.weights.spec import ReplicaDescription

    dims = DecoderDims(128, 256, 4, 2, 32, 128, 2, False, "float32", 4, 64, (1,))
    family = FAMILIES["qwen3_moe"]
    description = ReplicaDescription(2, layout_of("qwen3_moe", family.sliced_topology(dims)))
    msg = replica_description_to_proto(description, policy_version=3)
    assert msg.layout_digest == description.layout.digest()
    assert replica_description_from_proto(msg) == description
    msg.layout[0].split_dim = 7  # a layout that is not the one digested
    with pytest.raises(ValueError, match="layout_digest"):
        replica_description_from_proto(msg)
