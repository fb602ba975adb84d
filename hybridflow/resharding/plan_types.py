"""Plain views of one transfer, one bucket and one rank's role in a ``TransferPlan``."""

from __future__ import annotations

from dataclasses import dataclass

Range = tuple[int, int]


@dataclass(frozen=True)
class Transfer:
    """One slice of one source parameter moving from a source rank to a destination rank.

    Slices are ``(start, stop)`` per dimension of the source parameter (destination: of the
    destination's local tensor, which has the same ndim).
    """

    src_rank: int
    """Source (learner) rank, 0..W-1."""
    replica: int
    """Destination replica index."""
    dst_rank: int
    """TP rank within the replica."""
    source: str
    """Source parameter name."""
    dest: str
    """Destination parameter name."""
    global_slice: tuple[Range, ...]
    """The slice in the full source tensor's coordinates."""
    src_local_slice: tuple[Range, ...]
    """The same slice in the source rank's local dim-0 shard."""
    dst_local_slice: tuple[Range, ...]
    """Where it lands in the destination rank's local tensor."""
    bucket: int
    """Bucket id (global schedule order)."""
    offset_bytes: int
    """Byte offset in the bucket's flat buffer."""
    num_bytes: int
    """Bytes of the slice."""


@dataclass(frozen=True)
class Bucket:
    """One flat buffer sent by one source rank to one destination rank."""

    bucket_id: int
    """Position in the global schedule."""
    src_rank: int
    """Sending source rank."""
    replica: int
    """Receiving replica."""
    dst_rank: int
    """Receiving TP rank within the replica."""
    num_bytes: int
    """Buffer length in bytes (end of its last transfer)."""
    first: int
    """Index of its first transfer in the plan's columns."""
    stop: int
    """One past its last transfer."""


@dataclass(frozen=True)
class RankRole:
    """What a weight-sync group rank is in a plan."""

    group_rank: int
    """Rank in the weight-sync group."""
    is_source: bool
    """True for learner ranks."""
    src_rank: int
    """Source index (-1 for destinations)."""
    replica: int
    """Replica index (-1 for sources)."""
    tp_rank: int
    """TP rank within the replica (-1 for sources)."""
