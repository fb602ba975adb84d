"""Greedy packing of one (source rank -> destination rank) stream of transfers into buckets.

Within each pair, transfers are laid out in order in a flat buffer, each at an offset aligned
to ``align`` bytes (so any dtype can be viewed out of a byte buffer). A bucket is closed when
the next transfer does not fit; a transfer that does not fit is split along dim 0 at a row
boundary so its first rows complete the current bucket. A bucket exceeds ``bucket_bytes`` only
when a single row is larger than ``bucket_bytes``: that row then travels alone.

Transfers of at least ``SOLO_BYTES`` (or a whole bucket, if smaller) travel alone: each piece
starts a fresh bucket at offset 0 and closes it. A one-slice bucket of a contiguous slice is
then sent from and received into the tensors themselves (no packing copies; see
``executors._direct_view``); small transfers still share buckets.

Pure numpy over index arrays; the loop runs once per bucket, not per transfer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import numpy as np

SOLO_BYTES = 1 << 20
"""Transfers at least this large get buckets of their own."""


@dataclass(frozen=True)
class BucketAssignment:
    """Pieces of the input transfers, each placed in a bucket (creation order)."""

    orig: np.ndarray
    """Index of the input transfer each piece comes from."""
    row_delta: np.ndarray
    """First row of the piece relative to the transfer's first row."""
    row_count: np.ndarray
    """Rows in the piece."""
    bucket: np.ndarray
    """Bucket id of the piece (buckets numbered in creation order, pair-major)."""
    offset: np.ndarray
    """Byte offset of the piece in its bucket's buffer."""
    bucket_pair: np.ndarray
    """Pair index of each bucket."""
    bucket_seq: np.ndarray
    """Position of each bucket within its pair's stream."""


@overload
def align_up(num_bytes: np.ndarray, align: int) -> np.ndarray: ...
@overload
def align_up(num_bytes: int, align: int) -> int: ...
def align_up(num_bytes: np.ndarray | int, align: int) -> np.ndarray | int:
    """Round up to a multiple of ``align``: an array in gives an array out, an int an int."""
    return -(-num_bytes // align) * align


def assign_buckets(
    pair_starts: np.ndarray,
    num_rows: np.ndarray,
    row_bytes: np.ndarray,
    bucket_bytes: int,
    align: int,
) -> BucketAssignment:
    """Pack transfers ``pair_starts[p]:pair_starts[p+1]`` of every pair ``p`` into buckets."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes: need >= 1, got {bucket_bytes}")
    aligned = align_up(num_rows * row_bytes, align)
    incl = np.cumsum(aligned)
    excl = incl - aligned
    solo = aligned >= min(SOLO_BYTES, bucket_bytes)
    solo_at = np.flatnonzero(solo)
    orig: list[np.ndarray] = []
    delta: list[np.ndarray] = []
    count: list[np.ndarray] = []
    bucket: list[np.ndarray] = []
    offset: list[np.ndarray] = []
    bucket_pair: list[int] = []
    bucket_seq: list[int] = []
    for p in range(len(pair_starts) - 1):
        i, end = int(pair_starts[p]), int(pair_starts[p + 1])
        consumed, seq = 0, 0
        while i < end:
            bid, off = len(bucket_pair), 0
            while i < end:
                if solo[i] and consumed == 0 and off > 0:
                    break  # a solo transfer starts a fresh bucket
                if consumed == 0 and not solo[i]:
                    # Small transfers up to the next solo one may share this bucket.
                    k = int(np.searchsorted(solo_at, i))
                    stop = min(end, int(solo_at[k])) if k < len(solo_at) else end
                    target = int(excl[i]) + bucket_bytes - off
                    m = int(np.searchsorted(incl[i:stop], target, side="right"))
                    if m:
                        idx = np.arange(i, i + m)
                        orig.append(idx)
                        delta.append(np.zeros(m, dtype=np.int64))
                        count.append(num_rows[i : i + m])
                        bucket.append(np.full(m, bid, dtype=np.int64))
                        offset.append(off + excl[i : i + m] - excl[i])
                        off += int(incl[i + m - 1] - excl[i])
                        i += m
                        if i == end or solo[i]:
                            break
                left = int(num_rows[i]) - consumed
                room = ((bucket_bytes - off) // align) * align
                fit = min(left, room // int(row_bytes[i]))
                if fit <= 0:
                    if off > 0:
                        break
                    fit = 1  # a single row larger than a bucket travels alone
                orig.append(np.array([i]))
                delta.append(np.array([consumed]))
                count.append(np.array([fit]))
                bucket.append(np.array([bid]))
                offset.append(np.array([off]))
                off += int(align_up(fit * int(row_bytes[i]), align))
                consumed += fit
                if consumed < int(num_rows[i]):
                    break
                i, consumed = i + 1, 0
                if solo[i - 1]:
                    break  # and closes it
            bucket_pair.append(p)
            bucket_seq.append(seq)
            seq += 1

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    return BucketAssignment(
        orig=cat(orig),
        row_delta=cat(delta),
        row_count=cat(count),
        bucket=cat(bucket),
        offset=cat(offset),
        bucket_pair=np.asarray(bucket_pair, dtype=np.int64),
        bucket_seq=np.asarray(bucket_seq, dtype=np.int64),
    )
