"""Same-host weight sync through shared memory: 2 learner ranks -> one rollout replica (TP 1).

Three spawned processes join a gloo weight-sync group from a TCPStore this test serves (the
harness of test_resharding_dist.py). Small buckets give every (source, destination) pair
several buckets. Checked: after each of three syncs of changing weights the replica equals the
learner's full tensors bit for bit, every byte went through shared memory, and no segment name
is left in /dev/shm. A result the replica still holds is not overwritten by the next sync (the
second staging buffer takes it), and a buffer is reused once its result is dropped. A replica
that passes its own tensors gets them filled. With shared memory off on the learner the same
syncs go over the sockets. A replica that dies in the middle of a sync makes the learner ranks
raise (within the group's deadline, not hang) and leaves no segment behind.
"""

from __future__ import annotations

import datetime
import os
import queue
import time
import traceback
import uuid
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.models.families import DecoderDims
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.plan import make_plan
from hybridflow.resharding.topology import Topology
from hybridflow.weights.transport.shm import SHM_DIR

NUM_SOURCES = 2
BUCKET_BYTES = 4096
DEADLINE_S = 60.0
GROUP_TIMEOUT_S = 10.0
NUM_SYNCS = 3


def _topology() -> Topology:
    dims = DecoderDims(
        hidden=16, intermediate=24, num_heads=4, num_kv_heads=2, head_dim=4, vocab=30,
        num_layers=2, tie_embeddings=False, dtype="float32",
    )  # fmt: skip
    return decoder_topology(dims, fused=False)


def _full(topology: Topology, version: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + version)
    return {p.name: torch.randn(p.shape, generator=gen) for p in topology.params}


def _worker(rank: int, port: int, name: str, mode: str, results: Any) -> None:
    torch.set_num_threads(1)
    try:
        results.put((rank, _run(rank, port, name, mode)))
    except Exception:  # report to the parent instead of dying silently
        results.put((rank, {"error": traceback.format_exc()}))


def _die_at_the_start_of_sync_2() -> None:
    """Replica only: the process exits as sync 2 begins (before its sources may write)."""
    from hybridflow.weights.transport import same_host

    real, calls = same_host.SharedSources.begin, []

    def begin(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            os._exit(3)
        return real(*args)

    same_host.SharedSources.begin = begin  # type: ignore[method-assign]


def _run(rank: int, port: int, name: str, mode: str) -> dict[str, Any]:
    from hybridflow.weights.transport.executors import DistExecutor
    from hybridflow.weights.transport.group import check_plan_hash, init_weight_sync_group
    from hybridflow.weights.transport.reference import fsdp_shards

    topology = _topology()
    plan = make_plan(topology, NUM_SOURCES, [1], BUCKET_BYTES)
    group = init_weight_sync_group(
        "127.0.0.1", port, plan.world_size, rank, "gloo", timeout_s=GROUP_TIMEOUT_S,
        group_name=name, is_store_host=False, local_addr="127.0.0.1",
    )  # fmt: skip
    check_plan_hash(group, plan.content_hash())
    role = plan.role(rank)
    offer = not (mode == "off" and role.is_source)  # "off" is the learner's switch
    executor = DistExecutor(plan, group, shared_memory=offer, group_name=name)
    report: dict[str, Any] = {"shared_peers": list(executor.shared_peers), "syncs": []}
    if mode == "dies" and not role.is_source:
        _die_at_the_start_of_sync_2()
    own = None
    if mode == "given" and not role.is_source:
        from hybridflow.weights.transport.reference import allocate_destination

        own = allocate_destination(plan, 0, 0)
    held: dict[str, torch.Tensor] | None = None  # the previous sync's result, still in use
    try:
        for version in range(NUM_SYNCS):
            full = _full(topology, version)
            if role.is_source:
                result = executor.sync(fsdp_shards(topology, full, NUM_SOURCES, rank))
                moved = result.stats.num_bytes_sent
                report["syncs"].append([moved, result.stats.num_bytes_shared, True])
                continue
            result = executor.sync(own)
            equal = all(torch.equal(result.tensors[k], v) for k, v in full.items())
            if held is not None:  # the sync did not touch the result still held
                earlier = _full(topology, version - 1)
                equal &= all(torch.equal(held[k], v) for k, v in earlier.items())
            moved = result.stats.num_bytes_received
            report["syncs"].append([moved, result.stats.num_bytes_shared, equal])
            report.setdefault("pointers", []).append(next(iter(result.tensors.values())).data_ptr())
            held = result.tensors if own is None else None  # own tensors are overwritten
            del result
    except Exception as exc:  # the learner's view of a dead replica
        report["raised"] = f"{type(exc).__name__}: {exc}"
        executor.close()
        group.abort()
        return report
    executor.close()
    group.close()
    return report


def _run_group(mode: str) -> tuple[dict[int, dict[str, Any]], dict[int, int | None], str]:
    name = f"shmtest-{uuid.uuid4().hex[:8]}"
    store = dist.TCPStore(
        "127.0.0.1", 0, None, is_master=True, timeout=datetime.timedelta(seconds=DEADLINE_S),
        wait_for_workers=False,
    )  # fmt: skip
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    world = NUM_SOURCES + 1
    procs = [
        ctx.Process(target=_worker, args=(r, store.port, name, mode, results), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + DEADLINE_S
    reports: dict[int, dict[str, Any]] = {}
    expected = set(range(NUM_SOURCES)) if mode == "dies" else set(range(world))
    try:
        while not expected <= set(reports):
            try:
                rank, report = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                raise AssertionError(
                    f"ranks {sorted(expected - set(reports))} did not finish in {DEADLINE_S}s"
                ) from None
            assert "error" not in report, f"rank {rank}:\n{report['error']}"
            reports[rank] = report
        for p in procs:
            p.join(timeout=max(deadline - time.monotonic(), 1.0))
        codes = {r: p.exitcode for r, p in enumerate(procs)}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return reports, codes, name


def _leftovers(name: str) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"hfws-*{name}*"))


@pytest.mark.parametrize("mode", ["auto", "given", "off"])
def test_replica_equals_learner_after_every_sync(mode: str) -> None:
    reports, codes, name = _run_group(mode)
    assert codes == {0: 0, 1: 0, 2: 0}
    plan = make_plan(_topology(), NUM_SOURCES, [1], BUCKET_BYTES)
    assert plan.num_buckets > 2 * NUM_SOURCES  # several buckets per pair
    replica = reports[NUM_SOURCES]
    want = plan.bytes_received(0, 0)
    shared = mode != "off"
    assert replica["syncs"] == [[want, want if shared else 0, True]] * NUM_SYNCS
    assert replica["shared_peers"] == ([0, 1] if shared else [])
    for s in range(NUM_SOURCES):
        sent = plan.bytes_sent(s)
        assert reports[s]["syncs"] == [[sent, sent if shared else 0, True]] * NUM_SYNCS
        assert reports[s]["shared_peers"] == ([NUM_SOURCES] if shared else [])
    first, second, third = replica["pointers"]
    if mode == "auto":  # results are the staging buffers: held -> the other, dropped -> reused
        assert first != second and third == first
    if mode == "given":  # the replica's own tensors, every time
        assert first == second == third
    assert _leftovers(name) == []


def test_replica_dying_mid_sync_fails_the_learner_and_leaves_no_segment() -> None:
    reports, codes, name = _run_group("dies")
    assert codes[NUM_SOURCES] == 3  # the replica died where the test made it
    for s in range(NUM_SOURCES):
        assert reports[s]["shared_peers"] == [NUM_SOURCES]
        assert len(reports[s]["syncs"]) == 1, reports[s]  # sync 1 done, sync 2 raised
        assert "raised" in reports[s], reports[s]
        assert codes[s] == 0
    assert _leftovers(name) == []
