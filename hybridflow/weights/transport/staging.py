"""A destination rank's staging buffers: its received tensors, in shared memory.

A staging buffer is one ``shm.Segment`` laid out like ``allocate_destination`` after a 64-byte
header (the nonce ``same_host`` checks): same tensors, same order, every one 64-byte aligned.
Both sides of a same-host pair compute the layout from the plan alone (``staging_layout``), so
a source can copy its slices straight into the destination's tensors.

A result handed out as views of a buffer must not be overwritten while anything uses it, so a
buffer is reused only when its storage's use count is back to what setup left (every view,
however derived, holds the storage). This module knows segments, layouts and lifetimes; it
does not know groups or tokens.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hybridflow.resharding.plan import TransferPlan
from hybridflow.weights.transport.reference import allocate_destination
from hybridflow.weights.transport.shm import ALIGN_BYTES, Segment, aligned

log = logging.getLogger(__name__)

HEADER_BYTES = ALIGN_BYTES
"""Each staging buffer starts with a header holding its nonce; tensors follow, aligned."""
_POLL_S = 0.005
Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class TensorSlot:
    """Where one destination tensor sits in a staging buffer."""

    offset: int
    """Byte offset from the buffer's start (a multiple of 64)."""
    shape: tuple[int, ...]
    """The tensor's shape."""
    dtype: torch.dtype
    """The tensor's element type."""

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def staging_layout(
    plan: TransferPlan, replica: int, tp_rank: int
) -> tuple[dict[str, TensorSlot], int]:
    """Each destination tensor's place in a staging buffer of ``(replica, tp_rank)``, and the
    buffer's size; both sides of a pair compute it from the plan alone."""
    layout, offset = {}, HEADER_BYTES
    for name, t in allocate_destination(plan, replica, tp_rank, device="meta").items():
        layout[name] = TensorSlot(offset, tuple(t.shape), t.dtype)
        offset += aligned(t.numel() * t.element_size())
    return layout, offset


def layout_views(segment: Segment, layout: Mapping[str, TensorSlot]) -> dict[str, torch.Tensor]:
    """The destination tensors of a staging buffer, as views of its mapping."""
    base = segment.tensor
    return {
        name: base[s.offset : s.offset + s.num_bytes].view(s.dtype).view(s.shape)
        for name, s in layout.items()
    }


def storage_use_count(tensor: torch.Tensor) -> int | None:
    """How many tensors share ``tensor``'s storage (None where this torch cannot tell)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    return int(count(tensor.untyped_storage()._cdata))


class StagingBuffers:
    """A destination rank's staging buffers, and which of them earlier results still use."""

    def __init__(self, segments: Sequence[Segment], layout: Mapping[str, TensorSlot]) -> None:
        self.segments, self.layout = list(segments), dict(layout)
        self._baseline = [storage_use_count(s.tensor) for s in self.segments]
        self._usable = [True] * len(self.segments)
        first = next(iter(self.layout.values()), None)
        self._first_offset = None if first is None else first.offset

    @property
    def lends(self) -> bool:
        """Whether results may be handed out as views (this torch can count their users)."""
        return all(b is not None for b in self._baseline)

    def views(self, index: int) -> dict[str, torch.Tensor]:
        return layout_views(self.segments[index], self.layout)

    def index_of(self, tensors: Tensors) -> int | None:
        """The buffer whose views ``tensors`` are (an earlier result passed back), else None."""
        if self._first_offset is None:
            return None
        first = tensors[next(iter(self.layout))]
        for i, segment in enumerate(self.segments):
            if first.data_ptr() == segment.tensor.data_ptr() + self._first_offset:
                return i
        return None

    def in_use(self, index: int) -> bool:
        """Whether a tensor handed out earlier still views buffer ``index``."""
        return storage_use_count(self.segments[index].tensor) != self._baseline[index]

    def acquire(self, timeout_s: float) -> int:
        """A buffer no result uses, its pages reserved; waits up to ``timeout_s`` (RuntimeError
        after) for a holder to let one go."""
        deadline = time.monotonic() + timeout_s
        collected = False
        while True:
            for i in range(len(self.segments)):
                if self._usable[i] and not self.in_use(i) and self._reserve(i):
                    return i
            if not collected:  # a reference cycle may be all that holds one
                gc.collect()
                collected = True
                continue
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"shared memory: every staging buffer still holds weights of an earlier "
                    f"sync after {timeout_s:.0f}s; a receiver must drop a sync's tensors once "
                    f"it has loaded them"
                )
            time.sleep(_POLL_S)

    def _reserve(self, index: int) -> bool:
        segment = self.segments[index]
        try:
            segment.reserve()
        except OSError as exc:
            log.warning(
                "/dev/shm cannot hold a second %.1f MiB staging buffer (%s); a sync waits "
                "while the previous one is still being loaded",
                segment.num_bytes / 2**20,
                exc,
            )
            self._usable[index] = False
            return False
        return True

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments = []
