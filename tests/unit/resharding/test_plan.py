"""Planner properties over random topologies (hypothesis), plus hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.models.families import DecoderDims
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.buckets import assign_buckets
from hybridflow.resharding.plan import ALIGN_BYTES, TransferPlan, make_plan
from hybridflow.resharding.topology import (
    DestParam,
    DestPart,
    ParamSpec,
    Placement,
    Topology,
    dest_layout,
    fsdp_dim0_rows,
    part_region,
)
from hybridflow.weights.transport.reference import fsdp_shards, torch_dtype, tp_shards
from hybridflow.weights.transport.replay import replay_in_process

DTYPES = ["float32", "bfloat16", "float16", "int8", "float64"]


@st.composite
def cases(draw: st.DrawFn) -> tuple[Topology, int, list[int], int]:
    replicas = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3))
    lcm = math.lcm(*replicas)
    kv_ok = set(replicas) <= {1, 2, 4}
    params: list[ParamSpec] = []
    dests: list[DestParam] = []
    for i in range(draw(st.integers(1, 5))):
        placement = draw(st.sampled_from(list(Placement)))
        ndim = draw(st.integers((placement.split_dim or 0) + 1, 3))
        shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
        max_shards = None
        if placement.split_dim is not None:
            if placement is Placement.COLUMN and kv_ok and draw(st.booleans()):
                max_shards = draw(st.sampled_from([1, 2, 4]))
                shape[0] = max_shards * draw(st.integers(1, 3))
            else:
                shape[placement.split_dim] = lcm * draw(st.integers(1, 3))
        spec = ParamSpec(f"p{i}", tuple(shape), draw(st.sampled_from(DTYPES)))
        params.append(spec)
        dests.append(DestParam(f"d{i}", (DestPart(spec.name, placement, max_shards),)))
    if draw(st.booleans()):  # a fused destination, like qkv_proj
        tail, dtype = draw(st.integers(1, 4)), draw(st.sampled_from(DTYPES))
        parts = []
        for j in range(draw(st.integers(2, 3))):
            spec = ParamSpec(f"f{j}", (lcm * draw(st.integers(1, 3)), tail), dtype)
            params.append(spec)
            parts.append(DestPart(spec.name, Placement.COLUMN))
        dests.append(DestParam("fused", tuple(parts)))
    if draw(st.booleans()):  # blocks of one expert tensor, like FusedMoE's w13
        placement = draw(st.sampled_from([Placement.EXPERT_COLUMN, Placement.EXPERT_ROW]))
        num_blocks = draw(st.integers(1, 3))
        shape = [draw(st.integers(1, 5)) for _ in range(3)]
        shape[placement.split_dim or 0] = num_blocks * lcm * draw(st.integers(1, 2))
        spec = ParamSpec("experts", tuple(shape), draw(st.sampled_from(DTYPES)))
        params.append(spec)
        parts = [DestPart(spec.name, placement, None, b, num_blocks) for b in range(num_blocks)]
        dests.append(DestParam("blocks", tuple(parts)))
    num_src = draw(st.integers(1, 6))
    bucket = draw(st.sampled_from([1, 7, 16, 40, 100, 1000, 1 << 20]))
    return Topology(tuple(params), tuple(dests)), num_src, replicas, bucket


def _check_properties(plan: TransferPlan) -> None:
    topo, c = plan.topology, plan.columns
    written = {}
    for r, tp in enumerate(plan.replicas):
        for t in range(tp):
            for dest in topo.dests:
                shape, _ = dest_layout(topo, dest, tp)
                written[r, t, dest.name] = np.zeros(shape, dtype=np.int64)
    for tr in plan.transfers():
        spec = topo.param(tr.source)
        # Sources send only rows they own, expressed in their local coordinates.
        own = fsdp_dim0_rows(spec.shape[0], plan.num_src_ranks)[tr.src_rank]
        assert own[0] <= tr.global_slice[0][0] < tr.global_slice[0][1] <= own[1]
        assert tr.src_local_slice[0][0] == tr.global_slice[0][0] - own[0]
        # Destinations receive only slices of their own TP region.
        dest = next(d for d in topo.dests if d.name == tr.dest)
        parts = [p for p in dest.parts if p.source == tr.source]
        regions = [part_region(p, spec, plan.replicas[tr.replica], tr.dst_rank) for p in parts]
        if regions[0] is not None:
            lo, hi = tr.global_slice[parts[0].placement.split_dim or 0]
            assert any(r[0] <= lo < hi <= r[1] for r in regions if r is not None)
        written[tr.replica, tr.dst_rank, tr.dest][
            tuple(slice(a, b) for a, b in tr.dst_local_slice)
        ] += 1
        assert tr.offset_bytes % ALIGN_BYTES == 0
        assert tr.num_bytes == math.prod(b - a for a, b in tr.global_slice) * spec.itemsize
    for key, count in written.items():
        assert (count == 1).all(), f"{key} written {np.unique(count)} times"
    # Buckets: one pair each, within bucket_bytes unless a single row is larger than a bucket.
    for b in range(plan.num_buckets):
        bucket = plan.bucket(b)
        trs = plan.transfers(b)
        assert {(t.src_rank, t.replica, t.dst_rank) for t in trs} == {
            (bucket.src_rank, bucket.replica, bucket.dst_rank)
        }
        ends = [t.offset_bytes + t.num_bytes for t in trs]
        assert all(e <= t.offset_bytes for e, t in zip(ends, trs[1:]))
        if bucket.num_bytes > plan.bucket_bytes:
            assert len(trs) == 1 and trs[0].global_slice[0][1] - trs[0].global_slice[0][0] == 1
    # Byte totals: each destination rank receives exactly its local tensors.
    itemsize = {d.name: topo.param(d.parts[0].source).itemsize for d in topo.dests}
    for r, tp in enumerate(plan.replicas):
        for t in range(tp):
            local = sum(
                w.size * itemsize[name]
                for (rr, tt, name), w in written.items()
                if (rr, tt) == (r, t)
            )
            assert plan.bytes_received(r, t) == local
    assert sum(plan.bytes_sent(s) for s in range(plan.num_src_ranks)) == int(c["nbytes"].sum())


@settings(max_examples=60, deadline=None, database=None)
@given(cases())
def test_plan_properties_and_replay(case: tuple[Topology, int, list[int], int]) -> None:
    topo, num_src, replicas, bucket = case
    plan = make_plan(topo, num_src, replicas, bucket)
    _check_properties(plan)
    assert make_plan(topo, num_src, replicas, bucket).content_hash() == plan.content_hash()
    gen = torch.Generator().manual_seed(1)
    full = {
        p.name: (torch.randn(p.shape, generator=gen) * 50).to(torch_dtype(p.dtype))
        for p in topo.params
    }
    outs = replay_in_process(plan, [fsdp_shards(topo, full, num_src, s) for s in range(num_src)])
    for r, tp in enumerate(replicas):
        for t in range(tp):
            want = tp_shards(topo, full, tp, t)
            assert all(torch.equal(outs[r][t][k], want[k]) for k in want)


def test_split_params_give_each_tp_rank_one_tp_th() -> None:
    dims = DecoderDims(16, 32, 4, 4, 4, 64, 2, False, "bfloat16")
    topo = decoder_topology(dims)
    plan = make_plan(topo, 3, [1, 2, 4], 4096)
    norms = sum(p.num_bytes for p in topo.params if p.name.endswith("norm.weight"))
    for r, tp in enumerate([1, 2, 4]):
        for t in range(tp):
            assert plan.bytes_received(r, t) == (topo.num_bytes - norms) // tp + norms
    assert sum(plan.bytes_sent(s) for s in range(3)) == sum(
        (topo.num_bytes - norms) + norms * tp for tp in [1, 2, 4]
    )


def test_hash_is_deterministic_and_input_sensitive() -> None:
    topo = decoder_topology(DecoderDims(8, 12, 2, 1, 4, 10, 1, True, "float32"))
    base = make_plan(topo, 2, [1, 2], 256).content_hash()
    assert base == make_plan(topo, 2, [1, 2], 256).content_hash()
    others = {
        make_plan(topo, 3, [1, 2], 256).content_hash(),
        make_plan(topo, 2, [2, 1], 256).content_hash(),
        make_plan(topo, 2, [1, 2], 257).content_hash(),
        make_plan(
            decoder_topology(DecoderDims(8, 12, 2, 1, 4, 10, 1, True, "bfloat16")), 2, [1, 2], 256
        ).content_hash(),
    }
    assert base not in others and len(others) == 4


def test_make_plan_rejects_bad_inputs() -> None:
    topo = decoder_topology(DecoderDims(8, 12, 2, 1, 4, 10, 1, True, "float32"))
    with pytest.raises(ValueError, match="num_src_ranks"):
        make_plan(topo, 0, [1], 64)
    with pytest.raises(ValueError, match="bucket_bytes"):
        make_plan(topo, 1, [1], 0)
    with pytest.raises(ValueError, match="replicas"):
        make_plan(topo, 1, [], 64)


def test_bucket_packing_hand_computed() -> None:
    # One pair; transfer 0 has 3 rows of 16 B (48 B >= the 40 B bucket: it travels alone, split
    # 2 + 1 rows, and closes its last bucket), transfer 1 has 2 rows (32 B) in a fresh bucket.
    got = assign_buckets(np.array([0, 2]), np.array([3, 2]), np.array([16, 16]), 40, 16)
    pieces = list(zip(got.orig, got.row_delta, got.row_count, got.bucket, got.offset))
    assert [tuple(int(x) for x in p) for p in pieces] == [
        (0, 0, 2, 0, 0),
        (0, 2, 1, 1, 0),
        (1, 0, 2, 2, 0),
    ]
    assert got.bucket_seq.tolist() == [0, 1, 2]


def test_small_transfers_share_a_bucket_and_a_large_one_starts_its_own() -> None:
    # Transfers of 16, 16, 64 and 16 B; buckets of 64 B: the 64 B one is solo (>= a bucket).
    got = assign_buckets(
        np.array([0, 4]), np.array([1, 1, 4, 1]), np.array([16, 16, 16, 16]), 64, 16
    )
    pieces = list(zip(got.orig, got.row_count, got.bucket, got.offset))
    assert [tuple(int(x) for x in p) for p in pieces] == [
        (0, 1, 0, 0),
        (1, 1, 0, 16),
        (2, 4, 1, 0),
        (3, 1, 2, 0),
    ]


def test_ranks_roles_and_schedule() -> None:
    topo = decoder_topology(DecoderDims(8, 12, 2, 2, 4, 10, 1, False, "float32"))
    plan = make_plan(topo, 2, [1, 2], 1 << 20)
    assert plan.world_size == 5
    assert plan.group_rank(1, 1) == 4
    role = plan.role(3)
    assert (role.is_source, role.replica, role.tp_rank) == (False, 1, 0)
    # One bucket per pair; round 0 pairs source 0 with destination 0 and source 1 with 1.
    pairs = [(b.src_rank, b.replica, b.dst_rank) for b in map(plan.bucket, range(plan.num_buckets))]
    assert pairs == [(0, 0, 0), (1, 1, 0), (0, 1, 0), (1, 1, 1), (0, 1, 1), (1, 0, 0)]
