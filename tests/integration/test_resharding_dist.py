"""Resharding over a real gloo weight-sync group: 2 FSDP2 learner ranks -> replicas TP=1, TP=2.

Five spawned processes. Ranks 0-1 form their own default (FSDP) process group, ``fully_shard``
a module holding a small Llama-like parameter set, and feed ``to_local()`` shards to the
executors (so the planner's FSDP placement is checked against torch's). Ranks 2-4 hold only
their TP slices. All five also join a separate weight-sync group from one TCPStore that this
test process serves. Each destination checks, bit for bit, the naive executor's result, the
planned executor's result, and a replay after the learner changed its weights, against slicing
the full tensors directly.
"""

from __future__ import annotations

import datetime
import queue
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.models.families import DecoderDims
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.plan import make_plan
from hybridflow.resharding.topology import DestParam, DestPart, ParamSpec, Placement, Topology

NUM_SOURCES = 2
REPLICAS = [1, 2]
BUCKET_BYTES = 2048
DEADLINE_S = 180.0
"""A hang guard, not a speed check: spawned ranks import torch, slowly on a busy machine."""
SEED = 7


def _topology() -> Topology:
    base = decoder_topology(
        DecoderDims(
            hidden=16, intermediate=24, num_heads=4, num_kv_heads=2, head_dim=4, vocab=30,
            num_layers=2, tie_embeddings=False, dtype="float32",
        )
    )  # fmt: skip
    # Odd and single-row tensors: uneven FSDP shards and an empty one; a bf16 in the buckets.
    extra = [ParamSpec("extra.odd", (5, 3), "bfloat16"), ParamSpec("extra.one", (1, 4))]
    dests = [DestParam(p.name, (DestPart(p.name, Placement.REPLICATED),)) for p in extra]
    return Topology(base.params + tuple(extra), base.dests + tuple(dests))


def _full_tensors(topology: Topology, scale: float) -> dict[str, torch.Tensor]:
    from hybridflow.weights.transport.reference import torch_dtype

    gen = torch.Generator().manual_seed(SEED)
    return {
        p.name: (torch.randn(p.shape, generator=gen) * scale).to(torch_dtype(p.dtype))
        for p in topology.params
    }


def _fsdp_shards(
    topology: Topology, full: dict[str, torch.Tensor], store: dist.Store, rank: int
) -> dict[str, torch.Tensor]:
    """Shard a module holding ``full`` with FSDP2 over the default group; return local shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group(
        "gloo", store=dist.PrefixStore("fsdp/", store), rank=rank, world_size=NUM_SOURCES
    )
    root = torch.nn.Module()
    for name, tensor in full.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, torch.nn.Parameter(tensor.clone()))
    fully_shard(root, mesh=init_device_mesh("cpu", (NUM_SOURCES,)))
    return {name: p.to_local().detach() for name, p in root.named_parameters()}


def _worker(rank: int, port: int, results: Any) -> None:
    torch.set_num_threads(1)
    try:
        results.put((rank, _run(rank, port)))
    except Exception:  # report to the parent instead of dying silently
        results.put((rank, {"error": traceback.format_exc()}))


def _run(rank: int, port: int) -> dict[str, Any]:
    from hybridflow.weights.transport.executors import DistExecutor, NaiveExecutor
    from hybridflow.weights.transport.group import check_plan_hash, init_weight_sync_group
    from hybridflow.weights.transport.reference import fsdp_shards, tp_shards

    topology = _topology()
    plan = make_plan(topology, NUM_SOURCES, REPLICAS, BUCKET_BYTES)
    group = init_weight_sync_group(
        "127.0.0.1", port, plan.world_size, rank, "gloo", timeout_s=DEADLINE_S,
        is_store_host=False, local_addr="127.0.0.1",
    )  # fmt: skip
    check_plan_hash(group, plan.content_hash())
    naive, planned = NaiveExecutor(plan, group), DistExecutor(plan, group)
    role = plan.role(rank)
    full = _full_tensors(topology, 1.0)
    report: dict[str, Any] = {}
    if role.is_source:
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
        shards = _fsdp_shards(topology, full, store, rank)
        expected = fsdp_shards(topology, full, NUM_SOURCES, rank)
        report["fsdp_shapes"] = {k: list(v.shape) for k, v in shards.items()}
        report["fsdp_equal"] = all(torch.equal(shards[k], expected[k]) for k in expected)
        naive.sync(shards)
        first = planned.sync(shards)
        second = planned.sync({k: v * 2 for k, v in shards.items()})
        dist.destroy_process_group()
    else:
        ref = tp_shards(topology, full, plan.replicas[role.replica], role.tp_rank)
        doubled = {k: v * 2 for k, v in full.items()}
        ref2 = tp_shards(topology, doubled, plan.replicas[role.replica], role.tp_rank)
        got_naive = naive.sync().tensors
        first = planned.sync()
        out = {k: torch.full_like(v, float("nan")) for k, v in ref.items()}
        second = planned.sync(out)
        report["naive_equal"] = all(torch.equal(got_naive[k], ref[k]) for k in ref)
        report["planned_equal"] = all(torch.equal(first.tensors[k], ref[k]) for k in ref)
        report["replay_equal"] = all(torch.equal(out[k], ref2[k]) for k in ref2)
        report["replay_in_place"] = second.tensors["lm_head.weight"] is out["lm_head.weight"]
        report["expected_bytes"] = plan.bytes_received(role.replica, role.tp_rank)
    report["stats"] = [first.stats.num_bytes_sent, first.stats.num_bytes_received]
    report["second_stats"] = [second.stats.num_bytes_sent, second.stats.num_bytes_received]
    group.close()
    return report


def test_planned_and_naive_executors_match_direct_slicing_over_gloo() -> None:
    start = time.monotonic()
    store = dist.TCPStore(
        "127.0.0.1", 0, None, is_master=True, timeout=datetime.timedelta(seconds=DEADLINE_S),
        wait_for_workers=False,
    )  # fmt: skip
    plan = make_plan(_topology(), NUM_SOURCES, REPLICAS, BUCKET_BYTES)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, store.port, results), daemon=True)
        for r in range(plan.world_size)
    ]
    for p in procs:
        p.start()
    reports: dict[int, dict[str, Any]] = {}
    try:
        while len(reports) < len(procs):
            left = DEADLINE_S - (time.monotonic() - start)
            try:
                rank, report = results.get(timeout=max(left, 0.1))
            except queue.Empty:
                raise AssertionError(
                    f"ranks {sorted(set(range(len(procs))) - set(reports))} "
                    f"did not finish within {DEADLINE_S}s"
                ) from None
            assert "error" not in report, f"rank {rank}:\n{report['error']}"
            reports[rank] = report
        for p in procs:
            p.join(timeout=max(DEADLINE_S - (time.monotonic() - start), 1.0))
            assert p.exitcode == 0, f"pid {p.pid} exit code {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()

    for s in range(NUM_SOURCES):
        assert reports[s]["fsdp_equal"], f"source {s}: fully_shard shards differ from the planner's"
        assert reports[s]["stats"] == [plan.bytes_sent(s), 0]
        assert reports[s]["second_stats"] == [plan.bytes_sent(s), 0]
    # torch.chunk semantics: 5 rows -> 3 + 2; 1 row -> 1 + 0 (rank 1 holds an empty shard).
    assert reports[0]["fsdp_shapes"]["extra.odd"] == [3, 3]
    assert reports[1]["fsdp_shapes"]["extra.odd"] == [2, 3]
    assert reports[1]["fsdp_shapes"]["extra.one"][0] == 0
    for r in range(NUM_SOURCES, plan.world_size):
        rep = reports[r]
        assert rep["naive_equal"] and rep["planned_equal"], f"rank {r}: {rep}"
        assert rep["replay_equal"] and rep["replay_in_place"], f"rank {r}: {rep}"
        assert rep["stats"] == [0, rep["expected_bytes"]]
