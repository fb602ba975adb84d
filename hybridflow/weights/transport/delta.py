"""Delta syncs: after a group's first sync, a socket bucket carries only the elements that changed.

Both ends keep what the last sync moved: a source (``DeltaSource``) a copy of its shards as
it last sent them, a destination (``DeltaDestination``) a copy of its tensors as they last
landed. At each later sync a source compares every slice of a bucket with its copy, bit by
bit, and sends two messages: a header, per slice the number of elements that changed (or
``WHOLE``: the slice's bytes as they are, when that is smaller), then the payload, per slice
the changed elements' flat indices (int32) and their values in the wire dtype, or the raw
slice. The destination builds each slice as its copy with the changed elements written in,
so it ends bit-equal to a full sync; the delivery check (``checked``) compares every slice
with the source's fingerprint of the whole current slice, so a wrong base cannot pass.

When the base is not the expected one, the sync is full: the first sync of every group (a
rebuilt group after any failure, a replica that joined, restarted or rejoined gets a new
group and so a full sync), and any sync after one that failed (the group is rebuilt). Costs:
one more copy of the shards on each learner rank and of the received tensors on each replica
rank, a comparison of every element at the source, and a copy of every slice at the
destination. Same-host pairs (``same_host``) keep full copies: there the copy is the sync.

Pure tensors: no groups, no plans beyond the buckets' copy lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from hybridflow.weights.transport.fingerprint import int_view
from hybridflow.weights.transport.replay import CopyOp, RankBucket

WHOLE = -1
"""A header entry: this slice travels whole (its changed elements would take more bytes)."""

INDEX_BYTES = 4
"""Each changed element's flat index in its slice (int32: a slice holds < 2^31 elements)."""


@dataclass
class DeltaCounts:
    """What one bucket's delta held."""

    num_elements: int = 0
    """Elements compared."""
    num_changed: int = 0
    """Of them, those that changed (at the source; a destination counts a slice that came
    whole as all changed)."""
    num_bytes: int = 0
    """Header and payload bytes."""

    def add(self, other: DeltaCounts) -> None:
        self.num_elements += other.num_elements
        self.num_changed += other.num_changed
        self.num_bytes += other.num_bytes


class DeltaSource:
    """A source rank's side: its shards as last sent, and each bucket's encoding."""

    def __init__(self) -> None:
        self._sent: dict[str, torch.Tensor] = {}

    @property
    def has_base(self) -> bool:
        return bool(self._sent)

    def remember(self, shards: Mapping[str, torch.Tensor]) -> None:
        """After every sync: what it sent, the base of the next (copied into the buffers of
        the last when the shapes hold). Not updated bucket by bucket: one slice may go to
        several replicas, each of which must get it against the same base."""
        kept = {}
        for name, t in shards.items():
            old = self._sent.get(name)
            if old is None or old.shape != t.shape or old.dtype != t.dtype:
                old = torch.empty_like(t)
            old.copy_(t)
            kept[name] = old
        self._sent = kept

    def encode(
        self, bucket: RankBucket, shards: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, DeltaCounts]:
        """(header, payload, counts) of one bucket against what was sent last."""
        counts, parts = [], []
        stats = DeltaCounts()
        for op in bucket.ops:
            current = shards[op.name][op.index]
            sent = self._sent[op.name][op.index]
            changed = int_view(current) != int_view(sent)
            n = int(changed.sum())  # counted first: a slice that goes whole gathers nothing
            stats.num_elements += current.numel()
            stats.num_changed += n
            if n * (INDEX_BYTES + current.element_size()) >= op.num_bytes:
                counts.append(WHOLE)
                parts.append(current.contiguous().reshape(-1).view(torch.uint8))
            else:
                counts.append(n)
                index = changed.reshape(-1).nonzero().squeeze(1).to(torch.int32)
                parts += [index.view(torch.uint8), current[changed].view(torch.uint8)]
        device = next(iter(shards.values())).device
        header = torch.tensor(counts, dtype=torch.int64, device=device)
        payload = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        stats.num_bytes = header.numel() * 8 + payload.numel()
        return header, payload, stats


def _as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Payload bytes as ``dtype`` (copied first when their offset is not aligned to it)."""
    if raw.storage_offset() % dtype.itemsize:
        raw = raw.clone()
    return raw.view(dtype)


def payload_bytes(ops: tuple[CopyOp, ...], header: torch.Tensor) -> int:
    """The payload length a header announces (checked against the slices it names)."""
    total = 0
    for op, count in zip(ops, header.cpu().tolist(), strict=True):
        numel = op.num_bytes // op.dtype.itemsize
        if count == WHOLE:
            total += op.num_bytes
        elif 0 <= count <= numel:
            total += count * (INDEX_BYTES + op.dtype.itemsize)
        else:
            raise ValueError(f"delta header: {count} changed elements of a {numel}-element slice")
    return total


class DeltaDestination:
    """A destination rank's side: its tensors as they last landed, and each bucket's decoding."""

    def __init__(self) -> None:
        self._landed: dict[str, torch.Tensor] = {}

    @property
    def has_base(self) -> bool:
        return bool(self._landed)

    def remember(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """After a full sync: copies of what landed."""
        self._landed = {name: t.detach().clone() for name, t in tensors.items()}

    def decode(
        self,
        bucket: RankBucket,
        header: torch.Tensor,
        payload: torch.Tensor,
        out: Mapping[str, torch.Tensor],
    ) -> int:
        """Writes one bucket's slices into ``out`` (the copy with the changes in) and updates
        the copy; returns the elements that changed."""
        changed_total, offset = 0, 0
        for op, count in zip(bucket.ops, header.cpu().tolist(), strict=True):
            target = out[op.name][op.index]
            base = self._landed[op.name][op.index]
            if count == WHOLE:
                whole = _as(payload[offset : offset + op.num_bytes], op.dtype).view(target.shape)
                target.copy_(whole)
                base.copy_(whole)
                offset += op.num_bytes
                changed_total += target.numel()
                continue
            index_end = offset + count * INDEX_BYTES
            index = _as(payload[offset:index_end], torch.int32).to(torch.int64)
            values = _as(payload[index_end : index_end + count * op.dtype.itemsize], op.dtype)
            offset = index_end + count * op.dtype.itemsize
            if target.data_ptr() != base.data_ptr():
                target.copy_(base)
            where = torch.unravel_index(index, target.shape)
            target.index_put_(where, values)
            base.index_put_(where, values)
            changed_total += count
        return changed_total
