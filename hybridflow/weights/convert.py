"""Weight-sync protos <-> domain types (the one place both meet): the group and replica
descriptions, and the gRPC weight stream (``WeightChunk``s: a header, then the flat buffer in
chunks).

The stream's sender never concatenates the model: it streams each tensor's bytes in order. The
receiver appends the chunks to one buffer that grows with the bytes actually received (the
declared ``total_bytes`` is checked against the limit, never allocated up front) and views
each tensor out of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from hybridflow.resharding.layout import ParamLayout, ReplicaLayout
from hybridflow.rpc.codec import dtype_name, tensor_nbytes, tensor_to_bytes
from hybridflow.v1 import common_pb2, weight_sync_pb2
from hybridflow.weights.spec import GroupSpec, ReplicaDescription

if TYPE_CHECKING:
    import torch


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


def iter_weight_chunks(
    named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int, chunk_bytes: int
) -> Iterator[common_pb2.WeightChunk]:
    metas = []
    offset = 0
    for name, t in named_tensors:
        num_bytes = t.numel() * t.element_size()
        metas.append(
            common_pb2.TensorMeta(
                name=name,
                dtype=dtype_name(t.dtype),
                shape=list(t.shape),
                offset_bytes=offset,
                num_bytes=num_bytes,
            )
        )
        offset += num_bytes
    header = common_pb2.WeightHeader(
        policy_version=policy_version, tensors=metas, total_bytes=offset
    )
    yield common_pb2.WeightChunk(header=header)
    pending = bytearray()
    for _, t in named_tensors:
        pending += tensor_to_bytes(t)
        while len(pending) >= chunk_bytes:
            yield common_pb2.WeightChunk(data=bytes(pending[:chunk_bytes]))
            del pending[:chunk_bytes]
    if pending:
        yield common_pb2.WeightChunk(data=bytes(pending))


def receive_weights(
    chunks: Iterable[common_pb2.WeightChunk], max_bytes: int
) -> tuple[int, list[tuple[str, torch.Tensor]], int]:
    """Reads a weight stream → (policy_version, named tensors, bytes received)."""
    import torch

    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("payload") != "header":
        raise ValueError("weight stream must start with a header")
    header = first.header
    if not 0 <= header.total_bytes <= max_bytes:
        raise ValueError(
            f"weights of {header.total_bytes} bytes exceed server.max_message_bytes={max_bytes}"
        )
    expected = 0
    for meta in header.tensors:
        size = tensor_nbytes(meta.dtype, list(meta.shape))
        if meta.offset_bytes != expected or meta.num_bytes != size:
            raise ValueError(f"tensor {meta.name!r}: offset/size disagree with dtype and shape")
        expected += size
    if expected != header.total_bytes:
        raise ValueError("header.total_bytes does not match the tensors it lists")
    buffer = bytearray()
    for chunk in it:
        if chunk.WhichOneof("payload") != "data":
            raise ValueError("a second header inside one weight stream")
        if len(buffer) + len(chunk.data) > header.total_bytes:
            raise ValueError("weight stream is longer than its header says")
        buffer += chunk.data
    received = len(buffer)
    if received != header.total_bytes:
        raise ValueError(f"weight stream ended after {received} of {header.total_bytes} bytes")
    flat = (
        torch.frombuffer(buffer, dtype=torch.uint8)
        if received
        else torch.empty(0, dtype=torch.uint8)
    )
    tensors = []
    for meta in header.tensors:
        raw = flat[meta.offset_bytes : meta.offset_bytes + meta.num_bytes]
        tensors.append((meta.name, raw.view(getattr(torch, meta.dtype)).reshape(list(meta.shape))))
    return header.policy_version, tensors, received
