"""The SDK's protobuf bodies, to and from our types: a ``forward_backward`` request into
datums, and the per-datum log-probs and metrics into a ``ForwardBackwardOutput``
(docs/tinker-wire.md §3). Refuses what it does not decode (images, sparse tensors with bad
indices, unknown dtypes) with a ``BadRequest`` that names it; never guesses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridflow.errors import BadRequest
from hybridflow.services.learner.tenants import Datum
from hybridflow.v1 import tinker_wire_pb2 as pb

_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass(frozen=True)
class ForwardBackwardCall:
    """A decoded ``POST /api/v1/forward_backward``."""

    model_id: str
    seq_id: int
    datums: list[Datum]
    loss_fn: str
    config: dict[str, float]
    forward_only: bool


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    request = pb.ForwardBackwardRequest()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise BadRequest(
            f"forward_backward: the body is not a ForwardBackwardRequest: {exc}"
        ) from exc
    datums = [_datum(i, d) for i, d in enumerate(request.data)]
    config = dict(request.loss_fn_config)
    for key, value in request.loss_fn_config_v2.items():
        if value.WhichOneof("value") == "number":
            config[key] = value.number
        elif value.WhichOneof("value") == "text":
            raise BadRequest(f"loss_fn_config[{key!r}]: text values are not served")
    return ForwardBackwardCall(
        model_id=request.model_id,
        seq_id=request.seq_id,
        datums=datums,
        loss_fn=request.loss_fn,
        config=config,
        forward_only=request.forward_only,
    )


def _datum(index: int, datum: pb.Datum) -> Datum:
    pieces = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise BadRequest(f"datum {index}: {kind} chunks are not served (text only)")
        pieces.append(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4"))
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    inputs = {key: _tensor(index, key, t) for key, t in datum.loss_fn_inputs.items()}
    return Datum(tokens=tokens, inputs=inputs)


def _tensor(index: int, key: str, tensor: pb.Tensor) -> np.ndarray:
    dtype = _NUMPY.get(tensor.dtype)
    if dtype is None:
        raise BadRequest(f"datum {index}: loss_fn_inputs[{key!r}] has dtype {tensor.dtype}")
    shape = tuple(tensor.shape)
    where = f"datum {index}: loss_fn_inputs[{key!r}]"
    if tensor.WhichOneof("encoding") == "sparse_csr":
        return _from_csr(where, tensor.sparse_csr, dtype, shape)
    raw = tensor.dense
    if len(raw) % np.dtype(dtype).itemsize:
        raise BadRequest(f"{where}: {len(raw)} bytes is not a whole number of elements")
    flat = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
    if shape and int(np.prod(shape)) != flat.size:
        raise BadRequest(f"{where}: shape {shape} but {flat.size} elements")
    return flat.reshape(shape) if shape else flat


def _from_csr(where: str, csr: pb.SparseCsr, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) != 2:
        raise BadRequest(f"{where}: a sparse tensor must be 2-D, got shape {shape}")
    values = np.frombuffer(csr.values, dtype=np.dtype(dtype).newbyteorder("<"))
    crow = np.frombuffer(csr.crow_indices, dtype="<i8")
    cols = np.frombuffer(csr.col_indices, dtype="<i8")
    rows, width = shape
    if (
        len(crow) != rows + 1
        or len(cols) != len(values)
        or crow[0] != 0
        or crow[-1] != len(values)
        or np.any(np.diff(crow) < 0)
        or (len(cols) and (cols.min() < 0 or cols.max() >= width))
    ):
        raise BadRequest(f"{where}: inconsistent sparse CSR indices for shape {shape}")
    dense: np.ndarray = np.zeros(shape, dtype=dtype)
    row_of = np.repeat(np.arange(rows), np.diff(crow))
    dense[row_of, cols] = values
    return dense


def encode_forward_backward(
    logprobs: list[np.ndarray], metrics: dict[str, float], output_type: str = "LossFnOutput"
) -> bytes:
    """One ``ArrayRecord`` with a ``logprobs`` field (float32, one array per datum)."""
    arrays = [np.ascontiguousarray(lp, dtype="<f4") for lp in logprobs]
    offsets = np.cumsum([0, *(a.nbytes for a in arrays)]).astype("<i8")
    record = pb.ArrayRecord(num_datums=len(arrays))
    field = record.fields["logprobs"]
    field.data = b"".join(a.tobytes() for a in arrays)
    field.offsets = offsets.tobytes()
    field.dtype = pb.DTYPE_FLOAT32
    out = pb.ForwardBackwardOutput(loss_fn_output_type=output_type)
    out.loss_fn_outputs.append(record)
    for key, value in metrics.items():
        out.metrics[key] = value
    return out.SerializeToString()


def prompt_tokens(prompt: Any) -> np.ndarray:
    """The token ids of a JSON ``ModelInput`` (``{"chunks": [{"type": "encoded_text", ...}]}``)."""
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list) or not chunks:
        raise BadRequest("prompt: a ModelInput with at least one chunk")
    tokens: list[int] = []
    for chunk in chunks:
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise BadRequest(f"prompt: {kind} chunks are not served (text only)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise BadRequest("prompt: a chunk's tokens must be a list of integers")
        tokens.extend(ids)
    if not tokens:
        raise BadRequest("prompt: no tokens")
    return np.asarray(tokens, dtype=np.int64)


def encode_sample(
    sequences: list[tuple[list[int], list[float], bool]], prompt_logprobs: np.ndarray | None
) -> bytes:
    """A ``SampleResponse``: each sequence's tokens (int32), log-probs (float32) and stop
    reason, and the prompt's log-probs (NaN first) when asked for."""
    out = pb.SampleResponse()
    for tokens, logprobs, stopped in sequences:
        seq = out.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if stopped else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(tokens, dtype="<i4").tobytes()
        seq.logprobs = np.asarray(logprobs, dtype="<f4").tobytes()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype="<f4").tobytes()
    return out.SerializeToString()
