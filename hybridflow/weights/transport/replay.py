"""Replaying a plan on one rank: per-bucket copy lists, packing and unpacking flat byte buffers.

``rank_buckets`` turns the plan's columns into, for one group rank, the ordered list of buckets
it sends or receives and, per bucket, the tensor slices to copy. ``pack`` / ``unpack`` move
those slices between local tensors and a flat ``uint8`` buffer. ``replay_in_process`` runs a
whole plan in one process (no transport) for tests. Nothing here knows process groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hybridflow.resharding.plan import TransferPlan
from hybridflow.resharding.topology import fsdp_dim0_rows, part_col_dim
from hybridflow.weights.transport.reference import allocate_destination, torch_dtype


@dataclass(frozen=True)
class CopyOp:
    """One transfer as seen by one side: a slice of a local tensor <-> a range of a buffer."""

    name: str
    """Local tensor: source parameter (sender) or destination parameter (receiver)."""
    index: tuple[slice, ...]
    """Slices of the local tensor (dim 0 and the plan's column dim; other dims are whole)."""
    offset: int
    """Byte offset in the bucket buffer."""
    num_bytes: int
    """Bytes of the slice."""
    shape: tuple[int, ...]
    """Shape of the slice."""
    dtype: torch.dtype
    """Element type."""


@dataclass(frozen=True)
class RankBucket:
    """One bucket from this rank's point of view."""

    bucket_id: int
    """Global schedule position; also the point-to-point tag."""
    peer: int
    """Group rank on the other side."""
    num_bytes: int
    """Buffer length in bytes."""
    ops: tuple[CopyOp, ...]
    """Copies in buffer order."""


def rank_buckets(plan: TransferPlan, group_rank: int) -> list[RankBucket]:
    """The buckets ``group_rank`` sends (source) or receives (destination), in schedule order."""
    role, topo, c = plan.role(group_rank), plan.topology, plan.columns
    out = []
    for b in plan.buckets_for(group_rank):
        bucket = plan.bucket(int(b))
        ops = []
        for i in range(bucket.first, bucket.stop):
            spec = topo.params[int(c["source"][i])]
            cdim = part_col_dim(topo.dests[int(c["dest"][i])].parts[int(c["part"][i])], spec)
            rows = int(c["row_hi"][i]) - int(c["row_lo"][i])
            cols = int(c["col_hi"][i]) - int(c["col_lo"][i])
            shape = [rows, *spec.shape[1:]]
            if len(spec.shape) > 1:
                shape[cdim] = cols
            if role.is_source:
                name = spec.name
                chunk = -(-spec.shape[0] // plan.num_src_ranks)
                base = min(role.src_rank * chunk, spec.shape[0])
                r0, c0 = int(c["row_lo"][i]) - base, int(c["col_lo"][i])
            else:
                name = topo.dests[int(c["dest"][i])].name
                r0, c0 = int(c["dst_row"][i]), int(c["dst_col"][i])
            index: tuple[slice, ...] = (slice(r0, r0 + rows),)
            if len(spec.shape) > 1:
                index += (slice(None),) * (cdim - 1) + (slice(c0, c0 + cols),)
            ops.append(
                CopyOp(
                    name,
                    index,
                    int(c["offset"][i]),
                    int(c["nbytes"][i]),
                    tuple(shape),
                    torch_dtype(spec.dtype),
                )
            )
        if role.is_source:
            peer = plan.group_rank(bucket.replica, bucket.dst_rank)
        else:
            peer = bucket.src_rank
        out.append(RankBucket(bucket.bucket_id, peer, bucket.num_bytes, tuple(ops)))
    return out


def _view(buffer: torch.Tensor, op: CopyOp) -> torch.Tensor:
    return buffer[op.offset : op.offset + op.num_bytes].view(op.dtype).view(op.shape)


def pack(bucket: RankBucket, tensors: Mapping[str, torch.Tensor], buffer: torch.Tensor) -> None:
    for op in bucket.ops:
        _view(buffer, op).copy_(tensors[op.name][op.index])


def unpack(bucket: RankBucket, buffer: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> None:
    for op in bucket.ops:
        tensors[op.name][op.index].copy_(_view(buffer, op))


def check_source_shards(
    plan: TransferPlan, src_rank: int, shards: Mapping[str, torch.Tensor]
) -> None:
    """ValueError naming the first parameter whose local shard has the wrong shape or dtype."""
    for spec in plan.topology.params:
        if spec.name not in shards:
            raise ValueError(f"shards: missing {spec.name} on source rank {src_rank}")
        start, stop = fsdp_dim0_rows(spec.shape[0], plan.num_src_ranks)[src_rank]
        t = shards[spec.name]
        want = (stop - start, *spec.shape[1:])
        if t.numel() != 0 or want[0] != 0:
            if tuple(t.shape) != want or t.dtype != torch_dtype(spec.dtype):
                raise ValueError(
                    f"shards: {spec.name} on source rank {src_rank} is {tuple(t.shape)} "
                    f"{t.dtype}, expected {want} {spec.dtype}"
                )


def check_destination(
    plan: TransferPlan, replica: int, tp_rank: int, tensors: Mapping[str, torch.Tensor]
) -> None:
    """ValueError naming the first destination tensor with the wrong shape or dtype."""
    want = allocate_destination(plan, replica, tp_rank, device="meta")
    for name, w in want.items():
        t = tensors.get(name)
        if t is None or t.shape != w.shape or t.dtype != w.dtype:
            got = None if t is None else (tuple(t.shape), t.dtype)
            raise ValueError(f"out: {name} is {got}, expected {(tuple(w.shape), w.dtype)}")


def replay_in_process(
    plan: TransferPlan, shards: Sequence[Mapping[str, torch.Tensor]]
) -> list[list[dict[str, torch.Tensor]]]:
    """Run the plan with every rank in this process; returns ``[replica][tp_rank] -> tensors``."""
    if len(shards) != plan.num_src_ranks:
        raise ValueError(f"shards: need {plan.num_src_ranks} ranks' shards, got {len(shards)}")
    for s, shard in enumerate(shards):
        check_source_shards(plan, s, shard)
    outs = [
        [allocate_destination(plan, r, t) for t in range(tp)] for r, tp in enumerate(plan.replicas)
    ]
    sent = {b.bucket_id: (s, b) for s in range(plan.num_src_ranks) for b in rank_buckets(plan, s)}
    for r, tp in enumerate(plan.replicas):
        for t in range(tp):
            for bucket in rank_buckets(plan, plan.group_rank(r, t)):
                buffer = torch.empty(bucket.num_bytes, dtype=torch.uint8)
                src_rank, src_bucket = sent[bucket.bucket_id]
                pack(src_bucket, shards[src_rank], buffer)
                unpack(bucket, buffer, outs[r][t])
    return outs
