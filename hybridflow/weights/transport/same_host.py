"""Same-host pairs of a planned sync: sources copy straight into the destination's tensors.

Which pairs: a (source rank, destination rank) pair of a plan with buckets between them whose
two ranks published the same host identity (``shm.host_identity``) in the group's store. A
rank opts out by publishing "" (shared memory off, or a device without a shared segment).

The destination's tensors themselves live in shared memory. A destination rank with same-host
sources creates staging buffers laid out like ``allocate_destination`` (``staging_layout``);
its sources map them and, at each sync, copy every slice the plan gives them from their FSDP
shards straight into its place. That is one copy per byte, where a socket costs a kernel copy
at each end.

Setup is collective over the store, every wait bounded by the store's timeout:

1. every rank publishes its identity and reads everyone's;
2. a destination with candidate sources removes stale segments and creates ``NUM_STAGES``
   staging segments (0600). It reserves the first one's pages; if ``/dev/shm`` cannot hold
   it, every pair of this destination stays on sockets, with a warning naming the size. It
   writes a random nonce into each header and publishes the names and nonces;
3. each candidate source maps them, checks sizes and nonces, and answers "1", or "0" if it
   cannot see them (another ``/dev/shm``, another user);
4. the destination unlinks the names either way.

Per sync:

- the destination picks a staging buffer that no earlier result still uses (below) and sends
  each shared source a ready token ``(sync number, buffer)``;
- a source waits for that token at its first bucket for the destination, copies its slices in,
  and after its last bucket sends a done token ``(sync number, buckets written)``;
- the destination receives its socket buckets as usual (into the same tensors), then waits for
  every done token.

Tokens travel over the group with tags above every bucket id. So the group's timeouts bound
every wait, a dead peer fails the sync instead of hanging it, and the executor's deadlock
argument is unchanged (the only thing a source waits for is a token that every destination
sends first).

Lifetime: ``sync(None)`` returns views of a staging buffer. They stay valid and unchanged for
as long as anything references them (a rollout engine holds a staged update until it applies
it). A buffer is reused only when no tensor views it any more, that is, when its storage's use
count is back to what setup left. Two buffers let one sync land while the previous one waits
to be applied; the second one's pages are reserved only when it is first needed. If both
buffers are still held, the sync waits up to the group's timeout, then raises. A caller that
passes its own tensors gets them filled, at the cost of one more copy out of the buffer; it
may also pass back the tensors of an earlier result, to be overwritten in place.

Devices: only CPU tensors share a segment today (POSIX shared memory). A CUDA IPC segment (an
allocation exported with torch's CUDA IPC handles, exchanged through the store) would
implement ``Segment``'s members and add "cuda" to ``SHARED_DEVICE_TYPES``.
This module knows pairs and tokens; ``staging`` knows the buffers; the executor decides which
bucket goes where.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from hybridflow.resharding.plan import TransferPlan
from hybridflow.weights.transport.group import WeightSyncGroup
from hybridflow.weights.transport.reference import allocate_destination
from hybridflow.weights.transport.replay import RankBucket, rank_buckets
from hybridflow.weights.transport.shm import (
    Segment,
    host_identity,
    remove_stale_segments,
    segment_name,
)
from hybridflow.weights.transport.staging import (
    HEADER_BYTES,
    StagingBuffers,
    TensorSlot,
    layout_views,
    staging_layout,
)

log = logging.getLogger(__name__)

SHARED_DEVICE_TYPES = ("cpu",)
NUM_STAGES = 2
NONCE_BYTES = 16
Tensors = Mapping[str, torch.Tensor]


def _token(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def check_token(token: torch.Tensor, expected: Sequence[int], what: str) -> None:
    """RuntimeError unless a received token equals ``expected``: the two sides disagree."""
    got = [int(v) for v in token.tolist()]
    if got != list(expected):
        raise RuntimeError(f"shared memory {what}: expected {list(expected)}, got {got}")


class SharedSources:
    """A destination rank's same-host sources, which write into its staging buffers."""

    def __init__(
        self,
        group: WeightSyncGroup,
        staging: StagingBuffers,
        buckets: Sequence[RankBucket],
        tags: tuple[int, int],
        allocate: Callable[[], dict[str, torch.Tensor]],
    ) -> None:
        """``buckets``: this rank's buckets from shared sources; ``tags``: (ready, done);
        ``allocate``: fresh destination tensors, for when results cannot be lent."""
        self.group, self.staging, self.buckets = group, staging, list(buckets)
        self._ready_tag, self._done_tag = tags
        self._allocate = allocate
        self._expected: dict[int, int] = {}
        for b in self.buckets:
            self._expected[b.peer] = self._expected.get(b.peer, 0) + 1
        self._sends: list[tuple[torch.distributed.Work, torch.Tensor]] = []
        self._dones: list[tuple[int, torch.distributed.Work, torch.Tensor]] = []
        self._index, self._copy_out = 0, False

    @property
    def peers(self) -> tuple[int, ...]:
        return tuple(sorted(self._expected))

    def begin(self, sync: int, given: Tensors | None) -> dict[str, torch.Tensor]:
        """Pick a buffer, tell every shared source to write: the tensors this sync fills."""
        index = None if given is None else self.staging.index_of(given)
        passed_back = index is not None
        if index is None:
            index = self.staging.acquire(self.group.timeout_s)
        self._index = index
        if given is not None:
            out, self._copy_out = dict(given), not passed_back
        elif self.staging.lends:
            out, self._copy_out = self.staging.views(index), False
        else:
            out, self._copy_out = self._allocate(), True
        for peer in self.peers:
            token = _token(sync, index)
            self._sends.append((self.group.send(token, peer, self._ready_tag), token))
            done = torch.empty(2, dtype=torch.int64)
            self._dones.append((peer, self.group.recv(done, peer, self._done_tag), done))
        return out

    def finish(self, sync: int, out: dict[str, torch.Tensor]) -> None:
        """Every shared source wrote its buckets; copy them out if ``out`` is not the buffer."""
        for peer, work, done in self._dones:
            work.wait()
            check_token(done, (sync, self._expected[peer]), f"done from rank {peer}")
        self._dones.clear()
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()
        if self._copy_out:
            staged = self.staging.views(self._index)
            for bucket in self.buckets:
                for op in bucket.ops:
                    out[op.name][op.index].copy_(staged[op.name][op.index])

    def close(self) -> None:
        self._sends.clear()
        self._dones.clear()
        self.staging.close()


@dataclass
class _Destination:
    """A source's view of one same-host destination."""

    segments: list[Segment]
    """Its staging buffers, mapped."""
    copies: list[dict[int, list[tuple[torch.Tensor, str, tuple[slice, ...]]]]]
    """Per buffer, per bucket id: (destination view, source tensor name, source slices)."""
    last_bucket: int
    """The id of this source's last bucket for it (the done token follows that one)."""


class SharedDestinations:
    """A source rank's same-host destinations, whose staging buffers it writes into."""

    def __init__(
        self, group: WeightSyncGroup, destinations: dict[int, _Destination], tags: tuple[int, int]
    ) -> None:
        self.group, self.destinations = group, destinations
        self._ready_tag, self._done_tag = tags
        self._ready: dict[int, tuple[torch.distributed.Work, torch.Tensor]] = {}
        self._stage: dict[int, int] = {}
        self._sends: list[tuple[torch.distributed.Work, torch.Tensor]] = []

    @property
    def peers(self) -> tuple[int, ...]:
        return tuple(sorted(self.destinations))

    def begin(self) -> None:
        """Post the receive of every destination's ready token."""
        self._stage.clear()
        for peer in self.destinations:
            token = torch.empty(2, dtype=torch.int64)
            self._ready[peer] = (self.group.recv(token, peer, self._ready_tag), token)

    def write(self, bucket: RankBucket, shards: Tensors, sync: int) -> None:
        """Copy a bucket's slices into the destination's buffer (after its ready token)."""
        peer = bucket.peer
        dest = self.destinations[peer]
        stage = self._stage.get(peer)
        if stage is None:
            work, token = self._ready.pop(peer)
            work.wait()
            stage = int(token[1])
            if not 0 <= stage < len(dest.segments):
                stage = -1  # refused just below
            check_token(token, (sync, stage), f"ready from rank {peer}")
            self._stage[peer] = stage
        for view, name, index in dest.copies[stage][bucket.bucket_id]:
            view.copy_(shards[name][index])
        if bucket.bucket_id == dest.last_bucket:
            done = _token(sync, len(dest.copies[stage]))
            self._sends.append((self.group.send(done, peer, self._done_tag), done))

    def finish(self) -> None:
        """Every done token delivered."""
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()

    def close(self) -> None:
        self._sends.clear()
        self._ready.clear()
        for dest in self.destinations.values():
            dest.copies.clear()
            for segment in dest.segments:
                segment.close()
        self.destinations = {}


SharedLinks = SharedSources | SharedDestinations


def connect_shared(
    group: WeightSyncGroup,
    group_name: str,
    plan: TransferPlan,
    buckets: Sequence[RankBucket],
    enabled: bool,
) -> SharedLinks | None:
    """Collective setup (every rank of the group calls it once per executor): this rank's
    pairs that move through shared memory, or None. See the module docstring."""
    tag = int(group.store.add(f"shm/executors/{group.rank}", 1))
    prefix = f"shm/{tag}"
    offer = enabled and group.device.type in SHARED_DEVICE_TYPES
    group.store.set(f"{prefix}/host/{group.rank}", host_identity() if offer else "")
    keys = [f"{prefix}/host/{r}" for r in range(group.world_size)]
    group.store.wait(keys)
    hosts = [v.decode() for v in group.store.multi_get(keys)]
    mine = hosts[group.rank]
    candidates = sorted({b.peer for b in buckets if mine and hosts[b.peer] == mine})
    if not candidates:
        return None
    tags = (plan.num_buckets, plan.num_buckets + 1)
    if plan.role(group.rank).is_source:
        return _attach(group, prefix, plan, buckets, candidates, tags)
    return _create(group, f"{group_name}-e{tag}", prefix, plan, buckets, candidates, tags)


def _create(
    group: WeightSyncGroup,
    group_name: str,
    prefix: str,
    plan: TransferPlan,
    buckets: Sequence[RankBucket],
    candidates: list[int],
    tags: tuple[int, int],
) -> SharedSources | None:
    role = plan.role(group.rank)
    layout, size = staging_layout(plan, role.replica, role.tp_rank)
    key = f"{prefix}/stage/{group.rank}"
    for name in remove_stale_segments():
        log.warning("removed a stale shared-memory segment /dev/shm/%s", name)
    segments: list[Segment] = []
    published = False
    try:
        for b in range(NUM_STAGES):
            segments.append(Segment(segment_name(group_name, group.rank, b), size, True))
        offer = _offer(segments, size)
        group.store.set(key, offer)
        published = True
        accepted = [p for p in candidates if offer != "-" and _answer(group, prefix, p) == "1"]
        for segment in segments:
            segment.unlink()
    except BaseException:
        if not published:
            group.store.set(key, "-")  # the sources must not wait for an offer
        for segment in segments:
            segment.close()
        raise
    if not accepted:
        for segment in segments:
            segment.close()
        return None
    return SharedSources(
        group,
        StagingBuffers(segments, layout),
        [b for b in buckets if b.peer in accepted],
        tags,
        lambda: allocate_destination(plan, role.replica, role.tp_rank, group.device),
    )


def _offer(segments: list[Segment], size: int) -> str:
    """The offer the sources read: "name|nonce,..." per buffer, or "-" when ``/dev/shm``
    cannot hold the first buffer."""
    try:
        segments[0].reserve()
        for segment in segments[1:]:
            segment.reserve(HEADER_BYTES)  # the nonce's page; the rest when first needed
    except OSError as exc:
        log.warning(
            "/dev/shm cannot hold a %.1f MiB staging buffer (%s); weights come over sockets",
            size / 2**20,
            exc,
        )
        return "-"
    parts = []
    for segment in segments:
        nonce = secrets.token_bytes(NONCE_BYTES)
        segment.tensor[:NONCE_BYTES].copy_(torch.frombuffer(bytearray(nonce), dtype=torch.uint8))
        parts.append(f"{segment.name}|{nonce.hex()}")
    return ",".join(parts)


def _answer(group: WeightSyncGroup, prefix: str, peer: int) -> str:
    return group.store.get(f"{prefix}/ok/{peer}/{group.rank}").decode()


def _attach(
    group: WeightSyncGroup,
    prefix: str,
    plan: TransferPlan,
    buckets: Sequence[RankBucket],
    candidates: list[int],
    tags: tuple[int, int],
) -> SharedDestinations | None:
    destinations: dict[int, _Destination] = {}
    try:
        for peer in candidates:
            role = plan.role(peer)
            layout, size = staging_layout(plan, role.replica, role.tp_rank)
            segments = _attach_one(group, prefix, peer, size)
            if segments is not None:
                mine = [b for b in buckets if b.peer == peer]
                destinations[peer] = _destination(plan, group.rank, peer, layout, segments, mine)
    except BaseException:
        for dest in destinations.values():
            for segment in dest.segments:
                segment.close()
        raise
    return SharedDestinations(group, destinations, tags) if destinations else None


def _attach_one(group: WeightSyncGroup, prefix: str, peer: int, size: int) -> list[Segment] | None:
    """Map a destination's staging buffers (``size`` bytes each); answer "1" (mapped, nonces
    match) or "0"."""
    offer = group.store.get(f"{prefix}/stage/{peer}").decode()
    if offer == "-":
        return None
    ok_key = f"{prefix}/ok/{group.rank}/{peer}"
    segments: list[Segment] = []
    try:
        for part in offer.split(","):
            name, nonce = part.split("|")
            segments.append(Segment(name, size, False))
            if bytes(segments[-1].tensor[:NONCE_BYTES].tolist()).hex() != nonce:
                log.warning(
                    "rank %d: /dev/shm/%s is not rank %d's; sockets", group.rank, name, peer
                )
                raise FileNotFoundError(name)
    except (FileNotFoundError, PermissionError) as exc:
        log.info("rank %d: no shared memory with rank %d (%s); sockets", group.rank, peer, exc)
        for segment in segments:
            segment.close()
        group.store.set(ok_key, "0")
        return None
    except BaseException:
        for segment in segments:
            segment.close()
        group.store.set(ok_key, "0")  # the destination must not wait for an answer
        raise
    group.store.set(ok_key, "1")
    return segments


def _destination(
    plan: TransferPlan,
    rank: int,
    peer: int,
    layout: Mapping[str, TensorSlot],
    segments: list[Segment],
    mine: list[RankBucket],
) -> _Destination:
    """Pair each of this source's slices with its place in the destination's buffers."""
    theirs = {b.bucket_id: b for b in rank_buckets(plan, peer) if b.peer == rank}
    copies = []
    for segment in segments:
        views = layout_views(segment, layout)
        per_bucket = {}
        for bucket in mine:
            ops = []
            for src, dst in zip(bucket.ops, theirs[bucket.bucket_id].ops, strict=True):
                if (src.offset, src.shape) != (dst.offset, dst.shape):
                    raise RuntimeError(f"plan: bucket {bucket.bucket_id} differs between sides")
                ops.append((views[dst.name][dst.index], src.name, src.index))
            per_bucket[bucket.bucket_id] = ops
        copies.append(per_bucket)
    return _Destination(segments, copies, mine[-1].bucket_id)
