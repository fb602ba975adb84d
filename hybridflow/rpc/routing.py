"""Wire codec of mixture-of-experts routing (``RoutedExperts``): per sequence, the experts each
of its tokens went to, for the learner's router replay.

All sequences' rows are one int16 ``[rows, layers, top_k]`` tensor plus row offsets; a
sequence with zero rows carries none. Decoding checks the offsets and shape against the
bytes and gives read-only views over them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hybridflow.arrays import ROUTING_DTYPE, RoutingArray
from hybridflow.v1 import common_pb2

_WIRE = np.dtype("<i2")


def pack_routed(arrays: Sequence[RoutingArray | None]) -> common_pb2.RoutedExperts:
    """One message for the sequences' routing (None: not known for that sequence);
    ValueError when two sequences disagree on layers or top_k."""
    present = [a for a in arrays if a is not None]
    if not present:
        raise ValueError("routed experts: no sequence carries any")
    per_token = tuple(present[0].shape[1:])
    for i, a in enumerate(arrays):
        if a is not None and tuple(a.shape[1:]) != per_token:
            raise ValueError(
                f"routed experts [{i}]: {tuple(a.shape[1:])} layers x top_k, "
                f"others have {per_token}"
            )
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([0 if a is None else a.shape[0] for a in arrays], out=offsets[1:])
    flat = np.concatenate(present).astype(_WIRE, copy=False)
    return common_pb2.RoutedExperts(
        experts=common_pb2.Tensor(
            dtype="int16", shape=[int(offsets[-1]), *per_token], data=flat.tobytes()
        ),
        offsets=offsets.tolist(),
    )


def unpack_routed(
    msg: common_pb2.RoutedExperts, count: int, field: str
) -> list[RoutingArray | None]:
    """Per sequence its routing (None where it has zero rows); ValueError naming ``field``
    when the message does not describe ``count`` sequences of valid expert ids."""
    tensor = msg.experts
    if tensor.dtype != "int16" or len(tensor.shape) != 3:
        raise ValueError(f"{field}.experts: needs int16 [rows, layers, top_k], got "
                         f"{tensor.dtype} {list(tensor.shape)}")  # fmt: skip
    rows, layers, top_k = (int(d) for d in tensor.shape)
    if min(rows, layers, top_k) < 0 or len(tensor.data) != rows * layers * top_k * _WIRE.itemsize:
        raise ValueError(
            f"{field}.experts: {len(tensor.data)} bytes for shape {list(tensor.shape)}"
        )
    offsets = np.asarray(msg.offsets, dtype=np.int64)
    if (
        offsets.size != count + 1
        or (offsets.size and offsets[0] != 0)
        or bool(np.any(np.diff(offsets) < 0))
        or int(offsets[-1]) != rows
    ):
        raise ValueError(
            f"{field}.offsets: need {count + 1} non-decreasing entries from 0 to {rows}"
        )
    flat = np.frombuffer(tensor.data, dtype=_WIRE).reshape(rows, layers, top_k)
    if flat.size and int(flat.min()) < 0:
        raise ValueError(f"{field}.experts: negative expert id")
    flat = flat.astype(ROUTING_DTYPE, copy=False)
    return [
        flat[start:end] if end > start else None
        for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist())
    ]
