"""Token and float arrays of the domain types: dtypes, aliases and cheap conversions.

``hybridflow.types`` holds the dataclasses; this module holds what needs numpy, so that a
process importing only the score types never loads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

TokenArray = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float32]
RoutingArray = npt.NDArray[np.int16]
"""Mixture-of-experts routing: ``[tokens, moe layers, top_k]`` expert ids."""
MaskArray = npt.NDArray[np.uint8]
"""A 0/1 flag per token (multi-turn loss masks: 1 on policy tokens)."""

TokenLike = TokenArray | Sequence[int]
"""Token ids as an array, or as a list where a caller builds them by hand."""

TOKEN_DTYPE = np.dtype(np.int32)
FLOAT_DTYPE = np.dtype(np.float32)
ROUTING_DTYPE = np.dtype(np.int16)
MASK_DTYPE = np.dtype(np.uint8)


def as_tokens(values: Any) -> TokenArray:
    """``values`` as a 1-D int32 array (no copy when it already is one)."""
    if isinstance(values, np.ndarray) and values.dtype == TOKEN_DTYPE and values.ndim == 1:
        return values
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be a flat sequence of ints, got {arr.dtype}{arr.shape}")
    if arr.dtype != TOKEN_DTYPE and (arr.min() < -(2**31) or arr.max() >= 2**31):
        raise ValueError("token ids must fit in int32")
    return arr.astype(TOKEN_DTYPE, copy=False)


def as_routing(values: Any) -> RoutingArray:
    """``values`` as a 3-D int16 ``[tokens, layers, top_k]`` array of expert ids (no copy when
    it already is one); ValueError for another shape or an id outside int16's non-negatives."""
    arr = np.asarray(values)
    if arr.ndim != 3 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(
            f"routed experts must be [tokens, layers, top_k] ints, got {arr.dtype}{arr.shape}"
        )
    if arr.dtype == ROUTING_DTYPE:
        return arr
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(ROUTING_DTYPE).max):
        raise ValueError("routed experts: expert ids must be in [0, 32767]")
    return arr.astype(ROUTING_DTYPE, copy=False)


def as_floats(values: Any) -> FloatArray:
    """``values`` as a 1-D float32 array (no copy when it already is one)."""
    if isinstance(values, np.ndarray) and values.dtype == FLOAT_DTYPE and values.ndim == 1:
        return values
    arr = np.asarray(values, dtype=FLOAT_DTYPE)
    if arr.ndim != 1:
        raise ValueError(f"expected a flat sequence of floats, got shape {arr.shape}")
    return arr


def as_mask(values: Any) -> MaskArray:
    """``values`` as a 1-D uint8 array of 0/1 flags (no copy when it already is one);
    ValueError for another shape or a value other than 0 and 1."""
    if isinstance(values, np.ndarray) and values.dtype == MASK_DTYPE and values.ndim == 1:
        arr = values
    else:
        arr = np.asarray(values)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iub"):
            raise ValueError(f"a mask must be a flat sequence of 0/1, got {arr.dtype}{arr.shape}")
        if arr.size and (arr.min() < 0 or arr.max() > 1):
            raise ValueError("a mask holds 0 and 1 only")
        return arr.astype(MASK_DTYPE, copy=False)
    if arr.size and arr.max() > 1:
        raise ValueError("a mask holds 0 and 1 only")
    return arr
