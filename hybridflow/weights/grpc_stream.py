"""gRPC streaming weight transport: a header, then the flat buffer in chunks.

The sender never concatenates the model: it streams each tensor's bytes in order. The
receiver appends the chunks to one buffer that grows with the bytes actually received (the
declared ``total_bytes`` is checked against the limit, never allocated up front) and views
each tensor out of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from hybridflow.rpc.codec import dtype_name, tensor_nbytes, tensor_to_bytes
from hybridflow.v1 import common_pb2

if TYPE_CHECKING:
    import torch


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
