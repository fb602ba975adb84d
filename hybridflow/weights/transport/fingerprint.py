"""Exact fingerprints of tensor slices: how both ends of a weight sync check every byte landed.

A sync is checked slice by slice, on the units the plan already has: each source computes a
fingerprint of every slice it sends (from the tensors it sends them from), and sends the list
to each destination after its buckets; the destination computes the same of every slice where
it landed (after the sockets or a same-host source wrote it) and compares, before anything is
staged. A slice a source skipped, wrote elsewhere or wrote stale differs, and the error names
the destination's tensor and the slice. This checks delivery into the replica's tensors; that
the engine then loads every tensor is the engine's check (``vllm_worker``).

The fingerprint reads each element's bits as a signed integer of its width and takes
``(sum v, sum v*v)`` modulo 2^32. Integer sums do not depend on order, so a slice read from a
source's FSDP shard and the same slice in a destination's tensor give equal fingerprints
exactly (no tolerance), on any layout and in any chunking. The square term catches what the
plain sum can miss: a stale slice whose elements moved by +1 and -1 in the last bit (a bf16
replica after a small optimizer step) sums to the same total, but not to the same squares.
Cost: one read of the bytes on each side (about 0.12 s per GiB in fp32, 0.19 s in bf16
on one CPU thread of this project's 2-core AMD machine), on the send's thread at the source.

``sampled_fingerprint`` takes the same of ``count`` elements of a slice, at positions both
sides compute alike from the slice's size and a salt (the sync's number): the cheaper check
of the syncs after a group's first (``weight_sync.check``, docs/weight-sync.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

CHUNK_ELEMENTS = 1 << 18
"""Elements squared (and narrow ones widened) at a time: a 1 MiB int32 buffer."""

MASK = (1 << 32) - 1

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def int_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as signed integers of their width (same memory, any layout)."""
    return tensor.view(_INT_OF_WIDTH[tensor.element_size()])


def fingerprint(tensor: torch.Tensor, buffer: torch.Tensor | None = None) -> tuple[int, int]:
    """``(sum v, sum v*v) mod 2^32`` over the elements' bits as signed integers (8-byte
    elements: over their two 4-byte halves); any layout, strided slices included.
    ``buffer``: an int32 scratch tensor of ``CHUNK_ELEMENTS`` on the tensor's device, reused
    across calls. int32 arithmetic wraps, which is what keeps it exact and fast (widening to
    int64 costs three times as much)."""
    if tensor.numel() == 0:
        return 0, 0
    bits = int_view(tensor.reshape(1) if tensor.dim() == 0 else tensor)
    if bits.dtype == torch.int64:  # as 4-byte halves: the last dim doubles
        bits = (bits if bits.stride(-1) == 1 else bits.contiguous()).view(torch.int32)
    if buffer is None:
        buffer = torch.empty(CHUNK_ELEMENTS, dtype=torch.int32, device=tensor.device)
    total, squares = 0, 0
    narrow = bits.dtype != torch.int32
    for rows in _row_chunks(bits):
        wide = buffer[: rows.numel()].view(rows.shape)
        if narrow:  # 1- and 2-byte elements: widened first
            wide.copy_(rows)
            rows = wide
        total += int(rows.sum(dtype=torch.int32))
        torch.mul(rows, rows, out=wide)
        squares += int(wide.sum(dtype=torch.int32))
    return total & MASK, squares & MASK


SAMPLE_RUN = 64
"""Consecutive elements a sample reads at each of its places: a few memory pages per slice
instead of one per element (a scattered read of 1,024 elements in a slice another process
just wrote cost more than the whole read of a small slice)."""

_SPREADS: dict[tuple[int, int, str], tuple[torch.Tensor, int]] = {}
"""``_spread`` by (numel, count, device)."""


def _spread(numel: int, count: int, device: torch.device | str) -> tuple[torch.Tensor, int]:
    """The positions of ``sample_positions`` before their offset, and the modulus the salt's
    offset is taken by (1: no offset, the slice is read whole)."""
    key = (numel, count, str(device))
    cached = _SPREADS.get(key)
    if cached is not None:
        return cached
    runs = max(1, -(-count // SAMPLE_RUN))
    if numel <= runs * SAMPLE_RUN:
        cached = torch.arange(numel, device=device), 1
    else:
        step = numel // runs
        starts = torch.arange(0, step * runs, step, device=device)
        spread = (starts[:, None] + torch.arange(SAMPLE_RUN, device=device)).reshape(-1)
        cached = spread, step - SAMPLE_RUN + 1
    if len(_SPREADS) < 4096:  # one per slice size of a model: a few hundred
        _SPREADS[key] = cached
    return cached


def sample_positions(
    numel: int, count: int, salt: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``count`` flat (row-major) positions out of ``numel``: runs of ``SAMPLE_RUN``
    consecutive elements whose starts are evenly spread, all shifted by an offset the
    ``salt`` moves from one sync to the next; every position when ``numel`` is not larger
    than ``count``."""
    spread, modulus = _spread(numel, count, device)
    return spread if modulus == 1 else spread + (salt * 7919) % modulus


def sample_elements(tensor: torch.Tensor, count: int, salt: int) -> torch.Tensor:
    """The bits (as int32) of ``count`` of the tensor's elements at ``sample_positions`` in
    its row-major order (all of them when it has no more): equal on both sides of a copy
    whatever each side's strides, as long as both read the slice in the same row-major order
    (pack and unpack do)."""
    bits = int_view(tensor.reshape(1) if tensor.dim() == 0 else tensor)
    if bits.dtype == torch.int64:  # as 4-byte halves, as ``fingerprint`` reads them
        bits = (bits if bits.stride(-1) == 1 else bits.contiguous()).view(torch.int32)
    positions = sample_positions(bits.numel(), count, salt, bits.device)
    if bits.is_contiguous():
        picked = bits.view(-1).index_select(0, positions)
    else:
        picked = bits[torch.unravel_index(positions, bits.shape)]
    return picked if picked.dtype == torch.int32 else picked.to(torch.int32)


def fingerprints_of(samples: list[torch.Tensor]) -> list[tuple[int, int]]:
    """``fingerprint`` of each of ``samples`` (int32 tensors, ``sample_elements``), in a few
    operations for all of them together: padded with zeros (which add nothing to either
    sum) into one matrix, a row per sample."""
    if not samples:
        return []
    rows = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    sums = rows.sum(1, dtype=torch.int64)
    squares = rows.mul_(rows).sum(1, dtype=torch.int64)  # int32 products wrap: mod 2^32 kept
    return _pairs(sums, squares)


def _pairs(sums: torch.Tensor, squares: torch.Tensor) -> list[tuple[int, int]]:
    """Per-sample int64 sums of the elements and of their squares, as fingerprints."""
    pairs = torch.stack([sums, squares], 1).bitwise_and_(MASK).cpu().tolist()
    return [(a, b) for a, b in pairs]


def sampled_fingerprint(tensor: torch.Tensor, count: int, salt: int) -> tuple[int, int]:
    """``fingerprint`` of the tensor's ``sample_elements``."""
    return fingerprints_of([sample_elements(tensor, count, salt)])[0]


def sampled_fingerprints(
    views: Sequence[torch.Tensor], count: int, salt: int
) -> list[tuple[int, int]]:
    """``sampled_fingerprint`` of each of ``views``, equal to it view by view. Contiguous
    views that share a storage (a replica's slices in its shared-memory buffer) are read
    together: one gather of their samples out of the storage and two segment sums, where a
    view at a time costs four torch calls each. A 100M model's 222 slices, warm, on this
    project's 2-core machine: 19-27 ms a view at a time, 5-6 ms together; on the replica's
    path before it serves. The positions of such a set, before the sync's shift, are kept
    for the next sync (``_StoragePositions``)."""
    out: list[tuple[int, int] | None] = [None] * len(views)
    shared: dict[tuple[int, int, str], list[int]] = {}
    for i, view in enumerate(views):
        if view.is_contiguous() and view.numel() and view.element_size() in (1, 2, 4):
            key = (view.untyped_storage().data_ptr(), view.element_size(), str(view.device))
            shared.setdefault(key, []).append(i)
    for members in shared.values():
        if len(members) < 2:
            continue
        group = [views[i] for i in members]
        for i, print_ in zip(members, _storage_fingerprints(group, count, salt), strict=True):
            out[i] = print_
    alone = [i for i, print_ in enumerate(out) if print_ is None]
    if alone:
        prints = fingerprints_of([sample_elements(views[i], count, salt) for i in alone])
        for i, print_ in zip(alone, prints, strict=True):
            out[i] = print_
    return [print_ for print_ in out if print_ is not None]


class _StoragePositions:
    """The sample positions of a set of contiguous views of one storage, in the storage's
    elements: ``base`` (each view's ``_spread`` plus its offset), each view's modulus of the
    shift (1 where a view is read whole: no shift), how many positions
    each view has and the index of the view each position belongs to."""

    def __init__(self, spans: Sequence[tuple[int, int]], count: int, device: torch.device):
        bases, mods, lengths = [], [], []
        for offset, numel in spans:
            spread, modulus = _spread(numel, count, device)
            bases.append(spread + offset)
            mods.append(modulus)
            lengths.append(spread.numel())
        self.base = torch.cat(bases)
        self.mods = torch.tensor(mods, device=device)
        self.lengths = torch.tensor(lengths, device=device)
        self.owner = torch.arange(len(spans), device=device).repeat_interleave(self.lengths)
        self.num_views = len(spans)

    def at(self, salt: int) -> torch.Tensor:
        """The positions at ``salt``: as ``sample_positions`` moves each view's."""
        shifts = torch.remainder(salt * 7919, self.mods)  # a view's shift, then its positions'
        return self.base + shifts.repeat_interleave(self.lengths, output_size=len(self.base))


_POSITIONS: dict[tuple[object, ...], _StoragePositions] = {}
"""By (count, width, device, spans): a replica's buffers (one, or two while an update waits) give
the same spans at every sync, so a few entries serve a whole job."""


def _storage_fingerprints(
    views: Sequence[torch.Tensor], count: int, salt: int
) -> list[tuple[int, int]]:
    """``sampled_fingerprint`` of each of ``views``: contiguous, of one storage and width."""
    first = views[0]
    spans = tuple((int(v.storage_offset()), v.numel()) for v in views)
    key = (count, first.element_size(), str(first.device), spans)
    positions = _POSITIONS.get(key)
    if positions is None:
        positions = _StoragePositions(spans, count, first.device)
        if len(_POSITIONS) >= 8:  # not a job's: start again (threads only get, set and clear)
            _POSITIONS.clear()
        _POSITIONS[key] = positions
    bits = int_view(first)
    whole = bits.as_strided((first.untyped_storage().nbytes() // first.element_size(),), (1,), 0)
    picked = whole.index_select(0, positions.at(salt)).to(torch.int32)
    sums = torch.zeros(positions.num_views, dtype=torch.int64, device=first.device)
    squares = torch.zeros_like(sums)
    sums.index_add_(0, positions.owner, picked.to(torch.int64))
    squares.index_add_(0, positions.owner, picked.mul_(picked).to(torch.int64))  # int32: wraps
    return _pairs(sums, squares)


def _row_chunks(bits: torch.Tensor) -> list[torch.Tensor]:
    """Views of at most ``CHUNK_ELEMENTS`` elements each: runs of dim-0 rows, or, for rows
    longer than that, runs of rows of the tensor flattened past dim 0 when it is contiguous
    there (else one row at a time, split along its own dim 0)."""
    if bits.dim() == 1 or bits[0].numel() <= CHUNK_ELEMENTS:
        per = max(1, CHUNK_ELEMENTS // max(1, bits[0].numel() if bits.dim() > 1 else 1))
        return [bits[i : i + per] for i in range(0, bits.shape[0], per)]
    out: list[torch.Tensor] = []
    for row in bits:
        out.extend(_row_chunks(row))
    return out
