"""Weight-sync protos <-> domain types (the one place both meet): the group and replica
descriptions, and the gRPC weight stream (``WeightChunk``s: a header, then the flat buffer in
chunks).

The stream's sender never concatenates the model: it streams each tensor's bytes in order, in
chunks of at most ``chunk_bytes`` (a tensor's last chunk may be shorter), cast to the
replica's dtype where it asks for one. The receiver writes each chunk straight into the
tensor it belongs to, allocated when its first byte arrives: memory grows with the bytes
actually received, the declared ``total_bytes`` is checked against the bound and never
allocated up front. The bound is on the whole stream (``stream_bound``: twice the replica's
own weights at 4 bytes an element), so a model's size is not limited by what one gRPC
message may hold (``server.max_message_bytes`` bounds each chunk).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from hybridflow.resharding.layout import ParamLayout, ReplicaLayout
from hybridflow.rpc.codec import dtype_name, tensor_nbytes
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
        delta=spec.delta,
        check_samples=spec.check_samples,
    )


MIN_BUCKET_BYTES = 4096
MAX_RANKS = 1024
MAX_TP = 64
MAX_CHECK_SAMPLES = 1 << 20


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
    if not 0 <= msg.check_samples <= MAX_CHECK_SAMPLES:
        raise ValueError(f"check_samples must be in [0, {MAX_CHECK_SAMPLES}]")
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
        delta=msg.delta,
        check_samples=msg.check_samples,
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


MAX_DIM = 1 << 31
"""Largest dimension a streamed tensor may declare (a tensor is allocated from its header)."""
FRAMING_BYTES = 4096
"""Room a data chunk leaves under the message limit for the message's own framing."""


def iter_weight_chunks(
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    policy_version: int,
    chunk_bytes: int,
    dtype: str = "",
) -> Iterator[common_pb2.WeightChunk]:
    """A weight stream: the header, then each tensor's bytes in ``chunk_bytes`` pieces, then
    the trailer with each tensor's fingerprint as sent; ``dtype`` (a torch dtype's name, ""
    the tensors' own) is what the floating-point tensors travel as, cast one tensor at a
    time."""
    import torch

    from hybridflow.weights.transport.fingerprint import fingerprint

    cast = getattr(torch, dtype) if dtype else None
    metas = []
    offset = 0
    for name, t in named_tensors:
        wire = cast if cast is not None and t.is_floating_point() else t.dtype
        num_bytes = t.numel() * wire.itemsize
        metas.append(
            common_pb2.TensorMeta(
                name=name,
                dtype=dtype_name(wire),
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
    trailer = common_pb2.WeightTrailer()
    for (_, t), meta in zip(named_tensors, metas, strict=True):
        flat = t.detach().to("cpu", getattr(torch, meta.dtype)).contiguous().reshape(-1)
        total, squares = fingerprint(flat)
        trailer.sums.append(total)
        trailer.squares.append(squares)
        raw = flat.view(torch.uint8).numpy()
        for start in range(0, raw.size, chunk_bytes):
            yield common_pb2.WeightChunk(data=raw[start : start + chunk_bytes].tobytes())
    yield common_pb2.WeightChunk(trailer=trailer)


def stream_bound(layout: ReplicaLayout) -> int:
    """The most bytes a weight stream to a replica of ``layout`` may declare: twice its
    weights at the larger of 4 bytes and its own dtype's size an element (a learner that does
    not cast sends fp32; a tied head travels under both its names while the layout lists it
    once), and 1 MiB at least (a model with no layout)."""
    import torch

    itemsize = getattr(torch, layout.dtype).itemsize if layout.dtype else 4
    elements = sum(math.prod(p.shape) for p in layout.params)
    return max(2 * elements * max(itemsize, 4), 1 << 20)


def receive_weights(
    chunks: Iterable[common_pb2.WeightChunk], max_bytes: int
) -> tuple[int, list[tuple[str, torch.Tensor]], int]:
    """Reads a weight stream of at most ``max_bytes`` → (policy_version, named tensors,
    bytes received). Each tensor is allocated when its first byte arrives; once all are in,
    each is compared with the trailer's fingerprint: ``DeliveryFailed`` naming the first that
    differs, ``ValueError`` for a stream without a trailer."""
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("payload") != "header":
        raise ValueError("weight stream must start with a header")
    header = first.header
    if not 0 <= header.total_bytes <= max_bytes:
        raise ValueError(
            f"weights of {header.total_bytes} bytes exceed this replica's bound of {max_bytes} "
            "(twice its own weights at 4 bytes an element)"
        )
    expected = 0
    for meta in header.tensors:
        if any(not 0 <= d < MAX_DIM for d in meta.shape):
            raise ValueError(
                f"tensor {meta.name!r}: a dimension of {list(meta.shape)} is out of range"
            )
        size = tensor_nbytes(meta.dtype, list(meta.shape))
        if meta.offset_bytes != expected or meta.num_bytes != size:
            raise ValueError(f"tensor {meta.name!r}: offset/size disagree with dtype and shape")
        expected += size
    if expected != header.total_bytes:
        raise ValueError("header.total_bytes does not match the tensors it lists")
    filler = _TensorFiller(list(header.tensors))
    trailer = None
    for chunk in it:
        kind = chunk.WhichOneof("payload")
        if trailer is not None:
            raise ValueError("a weight stream goes on after its trailer")
        if kind == "trailer":
            trailer = chunk.trailer
        elif kind == "data":
            filler.write(chunk.data)
        else:
            raise ValueError("a second header inside one weight stream")
    if filler.received != header.total_bytes:
        raise ValueError(
            f"weight stream ended after {filler.received} of {header.total_bytes} bytes"
        )
    tensors = filler.finish()
    _check_trailer(trailer, tensors, header.policy_version)
    return header.policy_version, tensors, filler.received


def _check_trailer(
    trailer: common_pb2.WeightTrailer | None,
    tensors: Sequence[tuple[str, torch.Tensor]],
    policy_version: int,
) -> None:
    """Every received tensor against the sender's fingerprint of it (``WeightTrailer``)."""
    from hybridflow.errors import DeliveryFailed
    from hybridflow.weights.transport.fingerprint import fingerprint

    if trailer is None:
        raise ValueError("weight stream ended without its trailer (the tensors' fingerprints)")
    if len(trailer.sums) != len(tensors) or len(trailer.squares) != len(tensors):
        raise ValueError(
            f"the trailer lists {len(trailer.sums)} fingerprints for {len(tensors)} tensors"
        )
    for (name, tensor), total, squares in zip(tensors, trailer.sums, trailer.squares):
        got = fingerprint(tensor)
        if got != (total, squares):
            raise DeliveryFailed(
                f"weights v{policy_version}: tensor {name} did not arrive as sent: its bytes "
                f"here differ from the sender's (fingerprint {got[0]:08x}/{got[1]:08x}, sent "
                f"{total:08x}/{squares:08x})"
            )


class _TensorFiller:
    """Writes a stream's bytes into its tensors in order, each allocated at its first byte."""

    def __init__(self, metas: list[common_pb2.TensorMeta]) -> None:
        self._metas = metas
        self._done: list[tuple[str, torch.Tensor]] = []
        self._current: tuple[torch.Tensor, object] | None = None  # tensor, its uint8 view
        self._filled = 0
        self.received = 0
        self._skip_empty()

    def write(self, data: bytes) -> None:
        import numpy as np

        pos = 0
        while pos < len(data):
            if len(self._done) == len(self._metas):
                raise ValueError("weight stream is longer than its header says")
            meta = self._metas[len(self._done)]
            if self._current is None:
                self._current = self._allocate(meta)
            tensor, raw = self._current
            n = min(len(data) - pos, meta.num_bytes - self._filled)
            raw[self._filled : self._filled + n] = np.frombuffer(  # type: ignore[index]
                data, dtype=np.uint8, count=n, offset=pos
            )
            pos += n
            self._filled += n
            self.received += n
            if self._filled == meta.num_bytes:
                self._done.append((meta.name, tensor))
                self._current, self._filled = None, 0
                self._skip_empty()

    def finish(self) -> list[tuple[str, torch.Tensor]]:
        return self._done

    def _skip_empty(self) -> None:
        while len(self._done) < len(self._metas) and self._metas[len(self._done)].num_bytes == 0:
            meta = self._metas[len(self._done)]
            self._done.append((meta.name, self._allocate(meta)[0]))

    @staticmethod
    def _allocate(meta: common_pb2.TensorMeta) -> tuple[torch.Tensor, object]:
        import torch

        tensor = torch.empty(list(meta.shape), dtype=getattr(torch, meta.dtype))
        return tensor, tensor.reshape(-1).view(torch.uint8).numpy()
