"""Every sync checked slice by slice: what a source sent against where it landed.

``SentSlices`` (a source rank) takes the fingerprint (``fingerprint``) of every slice it sends,
from the tensors it sends them from, and after its buckets sends each destination the list of
that destination's slices over the group. ``LandedSlices`` (a destination rank) takes the same
of every slice where it landed in its tensors (after the sockets unpacked it, or a same-host
source copied it) and, once the lists arrive, compares: the first slice that differs raises
``DeliveryFailed`` naming the tensor, the slice and the learner rank it came from. The
executor raises before it returns the tensors, so nothing unchecked is staged or served.

Both sides walk the same buckets in the plan's order, so the lists line up without names on
the wire: one int64 pair per slice. With ``sample`` (count, salt) both take the fingerprint of
the same ``count`` elements of each slice instead (``sampled_fingerprint``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from hybridflow.errors import DeliveryFailed
from hybridflow.weights.transport.fingerprint import (
    CHUNK_ELEMENTS,
    fingerprint,
    fingerprints_of,
    sample_elements,
    sampled_fingerprints,
)
from hybridflow.weights.transport.group import WeightSyncGroup
from hybridflow.weights.transport.replay import CopyOp, RankBucket


def check_tag(num_buckets: int) -> int:
    """The tag fingerprint lists travel under: above every bucket id and the same-host
    tokens' two (``same_host``)."""
    return num_buckets + 2


class _Fingerprints:
    def __init__(self, device: torch.device, sample: tuple[int, int] | None = None) -> None:
        """``sample``: (elements per slice, salt) for a sampled check; None: every element."""
        self._device = device
        self._scratch = torch.empty(CHUNK_ELEMENTS, dtype=torch.int32, device=device)
        self._sample = sample
        self._samples: dict[int, list[torch.Tensor]] = {}
        """Sampled mode: each slice's sampled elements by peer, fingerprinted together."""
        self.by_peer: dict[int, list[tuple[int, int]]] = {}

    def add(self, bucket: RankBucket, tensors: Mapping[str, torch.Tensor]) -> None:
        if self._sample is not None:  # taken now (the tensors may change), summed at the end
            samples = self._samples.setdefault(bucket.peer, [])
            samples.extend(
                sample_elements(tensors[op.name][op.index], *self._sample) for op in bucket.ops
            )
            return
        rows = self.by_peer.setdefault(bucket.peer, [])
        rows.extend(fingerprint(tensors[op.name][op.index], self._scratch) for op in bucket.ops)

    def _settle(self) -> None:
        """Sampled mode: the fingerprints of the samples taken so far, into ``by_peer``."""
        for peer, samples in self._samples.items():
            self.by_peer.setdefault(peer, []).extend(fingerprints_of(samples))
        self._samples = {}

    def add_all(
        self, buckets: Sequence[RankBucket], tensors: Mapping[str, torch.Tensor], threads: int
    ) -> None:
        """``add`` for many buckets at once, over ``threads`` threads (torch's kernels let go
        of the GIL): what a destination does with the slices same-host sources wrote, which
        it can read only once they all have. Sampled: the slices of all the buckets in one
        ``sampled_fingerprints`` (the slices of one storage, a replica's shared-memory
        buffer, in one gather)."""
        if self._sample is not None:
            self._settle()  # what ``add`` took comes first: the lists keep the plan's order
            views = [(b.peer, tensors[op.name][op.index]) for b in buckets for op in b.ops]
            sampled = sampled_fingerprints([view for _, view in views], *self._sample)
            for (peer, _), print_ in zip(views, sampled, strict=True):
                self.by_peer.setdefault(peer, []).append(print_)
            return
        if threads <= 1 or len(buckets) < 2:
            for bucket in buckets:
                self.add(bucket, tensors)
            return
        ops = [(b.peer, op) for b in buckets for op in b.ops]
        scratch = [self._scratch] + [
            torch.empty(CHUNK_ELEMENTS, dtype=torch.int32, device=self._device)
            for _ in range(threads - 1)
        ]

        def run(k: int) -> list[tuple[int, int]]:
            return [
                fingerprint(tensors[op.name][op.index], scratch[k]) for _, op in ops[k::threads]
            ]

        with ThreadPoolExecutor(threads, "fingerprint") as pool:
            parts = list(pool.map(run, range(threads)))
        prints: list[tuple[int, int]] = [(0, 0)] * len(ops)
        for k, part in enumerate(parts):
            prints[k::threads] = part
        for (peer, _), print_ in zip(ops, prints, strict=True):
            self.by_peer.setdefault(peer, []).append(print_)


class SentSlices(_Fingerprints):
    """Source side of one sync (module doc)."""

    def __init__(
        self, group: WeightSyncGroup, tag: int, sample: tuple[int, int] | None = None
    ) -> None:
        super().__init__(group.device, sample)
        self._group, self._tag = group, tag
        self._sends: list[tuple[torch.distributed.Work, torch.Tensor]] = []

    def send(self) -> None:
        """Each destination its list (after its buckets: the lists are small)."""
        self._settle()
        for peer, rows in self.by_peer.items():
            message = torch.tensor(rows, dtype=torch.int64, device=self._group.device)
            self._sends.append((self._group.send(message, peer, self._tag), message))

    def wait(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()


class LandedSlices(_Fingerprints):
    """Destination side of one sync (module doc)."""

    def __init__(
        self,
        group: WeightSyncGroup,
        tag: int,
        buckets: Sequence[RankBucket],
        sample: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(group.device, sample)
        self._group, self._tag = group, tag
        self._ops: dict[int, list[CopyOp]] = {}
        for bucket in buckets:
            self._ops.setdefault(bucket.peer, []).extend(bucket.ops)

    def verify(self) -> None:
        """Receives every source's list (posted after the buckets: NCCL matches point-to-point
        calls in the order each pair posts them) and raises ``DeliveryFailed`` at the first
        slice that differs from what its source sent."""
        self._settle()
        posted = []
        for peer, ops in self._ops.items():
            message = torch.empty((len(ops), 2), dtype=torch.int64, device=self._group.device)
            posted.append((peer, self._group.recv(message, peer, self._tag), message))
        for peer, work, message in posted:
            work.wait()
            sent = [tuple(row) for row in message.cpu().tolist()]
            landed = self.by_peer.get(peer, [])
            for op, want, got in zip(self._ops[peer], sent, landed, strict=True):
                if tuple(got) != want:
                    which = f"{self._sample[0]} sampled elements" if self._sample else "bytes"
                    raise DeliveryFailed(
                        f"tensor {op.name} {_describe(op)} from learner rank {peer} did not "
                        f"arrive as sent: its {which} here differ from the learner's "
                        f"(fingerprint {got[0]:08x}/{got[1]:08x}, sent "
                        f"{want[0]:08x}/{want[1]:08x})"
                    )


def _describe(op: CopyOp) -> str:
    """The slice in words: 'rows 0:64, dim 1 0:128 of shape (64, 128)'."""
    parts = [
        f"{'rows' if d == 0 else f'dim {d}'} {s.start}:{s.stop}"
        for d, s in enumerate(op.index)
        if s.start is not None
    ]
    return f"({', '.join(parts)}; {tuple(op.shape)})"
