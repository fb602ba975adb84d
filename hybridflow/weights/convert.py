"""Weight-sync protos <-> domain types (the one place both meet)."""

from __future__ import annotations

import math

from hybridflow.resharding.layout import ParamLayout, ReplicaLayout
from hybridflow.v1 import weight_sync_pb2
from hybridflow.weights.spec import GroupSpec, ReplicaDescription


def group_spec_to_proto(
    spec: GroupSpec, replica_index: int
) -> weight_sync_pb2.JoinWeightSyncRequest:
    return weight_sync_pb2.JoinWeightSyncRequest(
        store_host=spec.store_host,
        store_port=spec.store_port,
        group_name=spec.group_name,
        backend=spec.backend,
        num_src_ranks=spec.num_src_ranks,
        replica_tp_sizes=list(spec.replica_tp_sizes),
        replica_index=replica_index,
        bucket_bytes=spec.bucket_bytes,
        executor=spec.executor,
        timeout_s=spec.timeout_s,
    )


MIN_BUCKET_BYTES = 4096
MAX_RANKS = 1024
MAX_TP = 64


def group_spec_from_proto(msg: weight_sync_pb2.JoinWeightSyncRequest) -> GroupSpec:
    if not msg.store_host or not 0 < msg.store_port < 65536:
        raise ValueError("store_host / store_port: a reachable TCPStore address is required")
    if msg.backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be gloo or nccl, got {msg.backend!r}")
    if not 0 <= msg.replica_index < len(msg.replica_tp_sizes):
        raise ValueError(f"replica_index {msg.replica_index} outside replica_tp_sizes")
    if msg.num_src_ranks < 1 or not msg.timeout_s > 0 or msg.bucket_bytes <= 0:
        raise ValueError("num_src_ranks, timeout_s and bucket_bytes must be positive")
    # Bounds that keep a malformed request from planning for hours or waiting for ever.
    if not math.isfinite(msg.timeout_s):
        raise ValueError("timeout_s must be finite")
    if msg.bucket_bytes < MIN_BUCKET_BYTES:
        raise ValueError(f"bucket_bytes must be at least {MIN_BUCKET_BYTES}")
    if msg.num_src_ranks > MAX_RANKS or len(msg.replica_tp_sizes) > MAX_RANKS:
        raise ValueError(f"num_src_ranks and the replica count must be at most {MAX_RANKS}")
    if any(not 1 <= t <= MAX_TP for t in msg.replica_tp_sizes):
        raise ValueError(f"replica_tp_sizes must be in [1, {MAX_TP}]")
    return GroupSpec(
        store_host=msg.store_host,
        store_port=msg.store_port,
        group_name=msg.group_name,
        backend=msg.backend,
        num_src_ranks=msg.num_src_ranks,
        replica_tp_sizes=tuple(msg.replica_tp_sizes),
        bucket_bytes=msg.bucket_bytes,
        executor=msg.executor,
        timeout_s=msg.timeout_s,
    )


def replica_description_to_proto(
    description: ReplicaDescription, policy_version: int
) -> weight_sync_pb2.WeightSyncInfo:
    layout = description.layout
    return weight_sync_pb2.WeightSyncInfo(
        tensor_parallel_size=description.tp_size,
        policy_version=policy_version,
        family=layout.family,
        layout_digest=layout.digest(),
        dtype=layout.dtype,
        layout=[
            weight_sync_pb2.ParamLayout(
                name=p.name,
                shape=list(p.shape),
                placement=p.placement,
                split_dim=p.split_dim,
                num_blocks=p.num_blocks,
                max_shards=p.max_shards,
                dest=p.dest,
            )
            for p in layout.params
        ],
    )


def replica_description_from_proto(msg: weight_sync_pb2.WeightSyncInfo) -> ReplicaDescription:
    layout = ReplicaLayout(
        family=msg.family,
        params=tuple(
            ParamLayout(
                name=p.name,
                shape=tuple(int(d) for d in p.shape),
                placement=p.placement,
                split_dim=p.split_dim,
                num_blocks=p.num_blocks,
                max_shards=p.max_shards,
                dest=p.dest,
            )
            for p in msg.layout
        ),
        dtype=msg.dtype,
    )
    if msg.layout_digest and msg.layout_digest != layout.digest():
        raise ValueError(
            f"layout_digest {msg.layout_digest[:12]} does not match the layout sent "
            f"({layout.digest()[:12]})"
        )
    return ReplicaDescription(int(msg.tensor_parallel_size) or 1, layout)
