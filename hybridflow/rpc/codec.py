"""Wire codec: token batches, tensors and chunked streams ↔ protobuf messages.

Token sequences become one int32 little-endian buffer plus offsets; float sequences become
one float32 tensor; decoding gives read-only numpy views over the message's bytes (one
``np.frombuffer`` per field, no per-token Python objects); large payloads travel as ``Chunk`` streams that the receiver appends to a
buffer that grows only with bytes actually received (a declared size is checked against the
limit, never allocated up front). Torch is imported only by the tensor helpers that need it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from google.protobuf.message import DecodeError, Message

from hybridflow.arrays import FLOAT_DTYPE, TOKEN_DTYPE, FloatArray, TokenArray, as_floats, as_tokens
from hybridflow.types import SamplingParams
from hybridflow.v1 import common_pb2

if TYPE_CHECKING:
    import torch

M = TypeVar("M", bound=Message)

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("u1"),
    "int8": np.dtype("i1"),
    "bool": np.dtype("?"),
}
_ITEMSIZE = {**{k: v.itemsize for k, v in _NUMPY_DTYPES.items()}, "bfloat16": 2}


# --- token batches ---------------------------------------------------------------------


def pack_tokens(sequences: Sequence[Any]) -> common_pb2.TokenBatch:
    """Packs sequences of token ids (int32 arrays, or lists) into one buffer plus offsets."""
    arrays = [as_tokens(s) for s in sequences]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=TOKEN_DTYPE)
    return common_pb2.TokenBatch(token_ids=_le_bytes(flat, "<i4"), offsets=offsets.tolist())


def _le_bytes(arr: np.ndarray, dtype: str) -> bytes:
    return arr.astype(dtype, copy=False).tobytes()


def unpack_tokens(batch: common_pb2.TokenBatch, field: str = "tokens") -> list[TokenArray]:
    """The sequences of a TokenBatch as read-only int32 views over its bytes (no copy);
    ValueError names ``field`` when the buffer and offsets disagree."""
    return split_by(*token_buffer(batch, field))


def token_buffer(
    batch: common_pb2.TokenBatch, field: str = "tokens"
) -> tuple[TokenArray, np.ndarray]:
    """A TokenBatch's flat int32 ids (a view over its bytes) and checked int64 offsets."""
    if len(batch.token_ids) % 4:
        raise ValueError(f"{field}.token_ids must be int32 (length divisible by 4)")
    flat = np.frombuffer(batch.token_ids, dtype="<i4")
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    if offsets.size == 0:
        if flat.size:
            raise ValueError(f"{field}.offsets is empty but token_ids is not")
        return flat.astype(TOKEN_DTYPE, copy=False), np.zeros(1, dtype=np.int64)
    if offsets[0] != 0 or offsets[-1] != flat.size:
        raise ValueError(
            f"{field}.offsets must start at 0 and end at {flat.size} (got {offsets[0]}..{offsets[-1]})"
        )
    if offsets.size > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
        raise ValueError(f"{field}.offsets must be non-decreasing")
    return flat.astype(TOKEN_DTYPE, copy=False), offsets


def check_token_range(batch: common_pb2.TokenBatch, vocab_size: int, field: str) -> None:
    """ValueError naming the sequence and id when a token is outside [0, vocab_size)."""
    check_ids(np.frombuffer(batch.token_ids, dtype="<i4"), batch.offsets, vocab_size, field)


def check_ids(flat: np.ndarray, offsets: Any, vocab_size: int, field: str) -> None:
    """``check_token_range`` over already decoded ids and offsets."""
    if flat.size == 0:
        return
    bad = np.flatnonzero((flat < 0) | (flat >= vocab_size))
    if bad.size:
        seq = int(np.searchsorted(np.asarray(offsets), bad[0], side="right")) - 1
        raise ValueError(
            f"{field}[{seq}]: token id {int(flat[bad[0]])} outside vocab [0, {vocab_size})"
        )


def split_by(flat: np.ndarray, offsets: np.ndarray) -> list[Any]:
    """Views of ``flat`` cut at ``offsets`` (num_sequences + 1 boundaries)."""
    return [flat[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


# --- float vectors (numpy) -------------------------------------------------------------


def pack_floats(values: Any, shape: Sequence[int] | None = None) -> common_pb2.Tensor:
    """A flat float32 tensor message."""
    arr = as_floats(values if isinstance(values, np.ndarray) else list(values))
    return common_pb2.Tensor(
        dtype="float32",
        shape=list(shape) if shape is not None else [arr.size],
        data=_le_bytes(arr, "<f4"),
    )


def pack_float_seqs(sequences: Sequence[Any]) -> common_pb2.Tensor:
    """Per-sequence floats (e.g. per-token log-probs) concatenated into one float32 tensor."""
    arrays = [as_floats(s) for s in sequences]
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=FLOAT_DTYPE)
    return common_pb2.Tensor(dtype="float32", shape=[flat.size], data=_le_bytes(flat, "<f4"))


def unpack_floats(
    tensor: common_pb2.Tensor, field: str, expected_size: int | None = None
) -> FloatArray:
    """A float32 tensor message as a flat read-only array over its bytes (no copy);
    ValueError names ``field`` on mismatch."""
    if tensor.dtype != "float32":
        raise ValueError(f"{field}: dtype must be float32, got {tensor.dtype!r}")
    if len(tensor.data) % 4:
        raise ValueError(f"{field}: data is not a whole number of float32 values")
    arr = np.frombuffer(tensor.data, dtype="<f4")
    numel = int(np.prod(tensor.shape)) if tensor.shape else 1
    if arr.size != numel:
        raise ValueError(
            f"{field}: shape {list(tensor.shape)} needs {numel} values, data has {arr.size}"
        )
    if expected_size is not None and arr.size != expected_size:
        raise ValueError(f"{field}: expected {expected_size} values, got {arr.size}")
    return arr.astype(FLOAT_DTYPE, copy=False)


def pack_ints(values: Any) -> common_pb2.Tensor:
    """A flat int32 tensor message."""
    arr = as_tokens(values if isinstance(values, np.ndarray) else list(values))
    return common_pb2.Tensor(dtype="int32", shape=[arr.size], data=_le_bytes(arr, "<i4"))


def unpack_ints(
    tensor: common_pb2.Tensor, field: str, expected_size: int | None = None
) -> TokenArray:
    """An int32 tensor message as a flat read-only array over its bytes (no copy);
    ValueError names ``field`` on mismatch."""
    if tensor.dtype != "int32":
        raise ValueError(f"{field}: dtype must be int32, got {tensor.dtype!r}")
    if len(tensor.data) % 4:
        raise ValueError(f"{field}: data is not a whole number of int32 values")
    arr = np.frombuffer(tensor.data, dtype="<i4")
    if expected_size is not None and arr.size != expected_size:
        raise ValueError(f"{field}: expected {expected_size} values, got {arr.size}")
    return arr.astype(TOKEN_DTYPE, copy=False)


# --- torch tensors ---------------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_nbytes(dtype: str, shape: Sequence[int]) -> int:
    if dtype not in _ITEMSIZE:
        raise ValueError(f"unsupported dtype {dtype!r}")
    return int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype] if shape else _ITEMSIZE[dtype]


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    """Raw contiguous little-endian bytes of a CPU tensor (bf16 as its 2 bytes)."""
    import torch

    t = t.detach().to("cpu").contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def tensor_from_buffer(
    buf: memoryview | bytes | bytearray, dtype: str, shape: Sequence[int]
) -> torch.Tensor:
    """A tensor over a copy of ``buf`` with the given dtype and shape."""
    import torch

    expected = tensor_nbytes(dtype, shape)
    if len(buf) != expected:
        raise ValueError(f"tensor of {dtype}{list(shape)} needs {expected} bytes, got {len(buf)}")
    torch_dtype = getattr(torch, dtype)
    raw = (
        torch.frombuffer(bytearray(buf), dtype=torch.uint8)
        if expected
        else torch.empty(0, dtype=torch.uint8)
    )
    return raw.view(torch_dtype).reshape(list(shape))


def tensor_to_proto(t: torch.Tensor) -> common_pb2.Tensor:
    return common_pb2.Tensor(
        dtype=dtype_name(t.dtype), shape=list(t.shape), data=tensor_to_bytes(t)
    )


def tensor_from_proto(msg: common_pb2.Tensor, field: str = "tensor") -> torch.Tensor:
    try:
        return tensor_from_buffer(msg.data, msg.dtype, list(msg.shape))
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{field}: {exc}") from exc


# --- chunked streams -------------------------------------------------------------------


def iter_chunks(payload: bytes, chunk_bytes: int) -> Iterator[common_pb2.Chunk]:
    """Splits a serialized payload into Chunk messages (at least one, even when empty)."""
    total = len(payload)
    view = memoryview(payload)
    offset = 0
    while True:
        piece = view[offset : offset + chunk_bytes]
        yield common_pb2.Chunk(total_bytes=total, offset=offset, data=bytes(piece))
        offset += len(piece)
        if offset >= total:
            return


def assemble_chunks(
    chunks: Iterable[common_pb2.Chunk],
    max_bytes: int,
    limit_name: str = "server.max_message_bytes",
) -> bytearray:
    """Joins a Chunk stream into one payload; ValueError on a malformed stream.

    The buffer grows with the data received: a stream that declares a huge ``total_bytes``
    and then stalls or ends costs only what it sent. Declared sizes beyond ``max_bytes``
    (the config key ``limit_name``) are refused before anything is read.
    """
    buffer = bytearray()
    declared: int | None = None
    for chunk in chunks:
        if declared is None:
            if chunk.total_bytes < 0 or chunk.total_bytes > max_bytes:
                raise ValueError(
                    f"payload of {chunk.total_bytes} bytes exceeds {limit_name}={max_bytes}"
                )
            declared = chunk.total_bytes
        if chunk.total_bytes != declared:
            raise ValueError("chunk.total_bytes changed within one stream")
        end = chunk.offset + len(chunk.data)
        if chunk.offset != len(buffer) or end > declared:
            raise ValueError(f"chunk at offset {chunk.offset} out of order or past the end")
        buffer += chunk.data
    if declared is None:
        raise ValueError("empty stream: no chunks received")
    if len(buffer) != declared:
        raise ValueError(f"stream ended after {len(buffer)} of {declared} bytes")
    return buffer  # parsed as is: protobuf reads a bytearray without another copy


def stream_message(msg: Message, chunk_bytes: int) -> Iterator[common_pb2.Chunk]:
    return iter_chunks(msg.SerializeToString(), chunk_bytes)


def receive_message(
    chunks: Iterable[common_pb2.Chunk],
    msg_type: type[M],
    max_bytes: int,
    limit_name: str = "server.max_message_bytes",
) -> M:
    payload = assemble_chunks(chunks, max_bytes, limit_name)
    msg = msg_type()
    try:
        msg.ParseFromString(payload)  # type: ignore[arg-type]  # a bytearray parses as is
    except DecodeError as exc:
        raise ValueError(f"payload is not a valid {msg_type.__name__}: {exc}") from exc
    return msg


# ---------------------------------------------------------------- sampling
def sampling_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_new_tokens=params.max_new_tokens,
        n=params.n,
        has_seed=params.seed is not None,
        seed=params.seed or 0,
        stop_token_ids=list(params.stop_token_ids),
        return_routed_experts=params.return_routed_experts,
    )


def sampling_from_proto(msg: common_pb2.SamplingParams) -> SamplingParams:
    params = SamplingParams(
        temperature=msg.temperature,
        top_p=msg.top_p,
        top_k=msg.top_k,
        max_new_tokens=msg.max_new_tokens,
        n=msg.n,
        seed=msg.seed if msg.has_seed else None,
        stop_token_ids=tuple(msg.stop_token_ids),
        return_routed_experts=msg.return_routed_experts,
    )
    params.validate()
    return params
