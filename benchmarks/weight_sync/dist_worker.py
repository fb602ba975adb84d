"""One rank of a torch.distributed variant (planner or naive) in a spawned process.

Ranks ``0..W-1`` are learner sources holding only their FSDP dim-0 rows (built with the same
``fsdp_dim0_rows`` rule FSDP2's ``fully_shard`` uses, checked against ``fully_shard`` in
tests/integration/test_resharding_dist.py), then the replica's TP ranks, which receive into
destination tensors reused at every sync (vLLM-style fused layout): preallocated ones over
sockets; with shared memory, the staging tensors the first sync returns, passed back after. Every sync
starts after a group barrier; each rank records ``perf_counter`` (CLOCK_MONOTONIC, shared by
all processes of one host) around it, so the orchestrator takes a sync's span as the latest end
minus the earliest start. Peak RSS is read before the raw broadcast and the check, which
allocate. This module knows one rank; it does not start processes or compute ratios.
"""

from __future__ import annotations

import resource
import time
import traceback
from typing import Any

from benchmarks.weight_sync.spec import VariantSpec


def memory_kib() -> dict[str, int]:
    """ru_maxrss (KiB on Linux) and the kernel's VmHWM / VmRSS of this process."""
    out = {"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key.lower() + "_kib"] = int(value.split()[0])
    return out


def run_rank(spec: VariantSpec, rank: int, results: Any) -> None:
    """Process entry point: run one rank and put ``(rank, report)`` on ``results``."""
    import torch

    torch.set_num_threads(1)
    try:
        report = _run(spec, rank)
    except Exception:  # the orchestrator reports it; a dead rank must not look like a hang
        report = {"error": traceback.format_exc()}
    results.put((rank, report))


def _timed(fn: Any, group: Any, count: int, warmup: int) -> tuple[list[float], list[float], Any]:
    starts, ends, last = [], [], None
    for i in range(warmup + count):
        group.barrier()
        t0 = time.perf_counter()
        last = fn()
        t1 = time.perf_counter()
        if i >= warmup:
            starts.append(t0)
            ends.append(t1)
    return starts, ends, last


def _run(spec: VariantSpec, rank: int) -> dict[str, Any]:
    import torch

    from benchmarks.weight_sync.models import full_tensors, get_model, param_rows, topology_of
    from hybridflow.resharding.plan import make_plan
    from hybridflow.resharding.topology import fsdp_dim0_rows
    from hybridflow.weights.transport.executors import DistExecutor, NaiveExecutor
    from hybridflow.weights.transport.group import check_plan_hash, init_weight_sync_group
    from hybridflow.weights.transport.reference import allocate_destination, tp_shards

    topology = topology_of(get_model(spec.model))
    plan = make_plan(topology, spec.num_src, [spec.tp], spec.bucket_bytes)
    group = init_weight_sync_group(
        "127.0.0.1", spec.store_port, plan.world_size, rank, "gloo", spec.timeout_s,
        group_name=f"bench/{spec.model}/{spec.label}", is_store_host=False,
        local_addr="127.0.0.1",
    )  # fmt: skip
    check_plan_hash(group, plan.content_hash())
    executor: DistExecutor | NaiveExecutor
    if spec.kind == "naive":
        executor = NaiveExecutor(plan, group)
    else:
        name = f"bench-{spec.model}-{spec.label}"
        executor = DistExecutor(
            plan,
            group,
            shared_memory=spec.kind == "shm",
            group_name=name,
            check=spec.check,
            sample=spec.check_samples,
        )
    role = plan.role(rank)
    baseline = memory_kib()
    tensors: dict[str, torch.Tensor] | None
    if role.is_source:
        tensors = {}
        for i, p in enumerate(topology.params):
            lo, hi = fsdp_dim0_rows(p.shape[0], spec.num_src)[role.src_rank]
            tensors[p.name] = param_rows(i, p.shape, lo, hi)
    elif spec.kind == "shm":
        tensors = None  # the first sync returns the staging tensors; later ones reuse them
    else:
        tensors = allocate_destination(plan, role.replica, role.tp_rank)
    received: dict[str, Any] = {"tensors": tensors, "syncs": 0}

    def one_sync() -> Any:
        timed = received["syncs"] - spec.num_warmup
        received["syncs"] += 1
        if spec.alternate and isinstance(executor, DistExecutor) and timed >= 0:
            executor.check = timed % 2 == 1  # every rank counts alike: both ends agree
        result = executor.sync(received["tensors"])
        if not role.is_source:
            received["tensors"] = result.tensors
        return result

    starts, ends, last = _timed(one_sync, group, spec.num_syncs, spec.num_warmup)
    tensors = received.pop("tensors")
    assert tensors is not None
    report: dict[str, Any] = {
        "rank": rank,
        "role": "source" if role.is_source else "destination",
        "starts": starts,
        "ends": ends,
        "bytes_sent": last.stats.num_bytes_sent,
        "bytes_received": last.stats.num_bytes_received,
        "num_messages": last.stats.num_messages,
        "memory": memory_kib(),
        "memory_baseline": baseline,
        "plan_bytes": (
            plan.bytes_sent(role.src_rank)
            if role.is_source
            else plan.bytes_received(role.replica, role.tp_rank)
        ),
        "num_buckets": plan.num_buckets,
        "bytes_shared": last.stats.num_bytes_shared,
        "alternating": spec.alternate,
    }
    if spec.raw_broadcast:
        report["raw"] = _raw_broadcast(spec, plan, group, rank)
    if not role.is_source:
        expected = tp_shards(topology, full_tensors(topology), spec.tp, role.tp_rank)
        report["verified"] = all(torch.equal(tensors[k], v) for k, v in expected.items())
        del expected
    if spec.parity_syncs and spec.tp == 1:
        report["logprob_max_abs_diff"] = _parity(spec, executor, tensors, role.is_source)
    executor.close()
    group.close()
    return report


def _raw_broadcast(spec: VariantSpec, plan: Any, group: Any, rank: int) -> dict[str, Any]:
    """The wire's own pace in the same group: rank 0 broadcasts the bytes one destination rank
    receives, timed like the syncs (the baseline of ``planner_over_raw_bandwidth``)."""
    import torch

    num_bytes = max(plan.bytes_received(0, t) for t in range(spec.tp))
    buffer = torch.full((num_bytes,), rank, dtype=torch.uint8)
    starts, ends, _ = _timed(
        lambda: group.broadcast(buffer, 0).wait(), group, spec.num_syncs, spec.num_warmup
    )
    return {"starts": starts, "ends": ends, "num_bytes": num_bytes, "ok": bool((buffer == 0).all())}


def _parity(
    spec: VariantSpec, executor: Any, tensors: dict[str, Any], is_source: bool
) -> list[float]:
    """Untimed syncs of weights shifted by 0.01 * (i + 1); a destination compares the fixed
    batch's log-probs with those of the learner's (full, equally shifted) weights."""
    from benchmarks.weight_sync.models import full_tensors, get_model, topology_of
    from benchmarks.weight_sync.parity import batch_logprobs, unfuse

    model = get_model(spec.model)
    diffs = []
    for i in range(spec.parity_syncs):
        shift = 0.01 * (i + 1)
        if is_source:
            executor.sync({k: v + shift for k, v in tensors.items()})
            continue
        executor.sync(tensors)
        learner = {k: v.add_(shift) for k, v in full_tensors(topology_of(model)).items()}
        want = batch_logprobs(learner, model.dims)
        del learner
        got = batch_logprobs(unfuse(tensors, model.dims), model.dims)
        diffs.append(float((got - want).abs().max()))
    return diffs
