"""Executors: move weights from the learner's FSDP shards into every replica's TP layout.

``DistExecutor`` replays a ``TransferPlan`` with point-to-point ``send``/``recv`` over the
weight-sync group, in flat byte buckets, double-buffered: a source packs bucket k+1 while bucket
k is in flight; a destination has the next receive posted while it unpacks the current one.
Every rank walks its buckets in plan order (one global order), so the exchange cannot deadlock.
The same code runs on gloo (CPU tensors) and NCCL (CUDA tensors). With ``shared_memory``, a
destination with sources on its host keeps its tensors in shared memory and those sources copy
their buckets straight into them, signalled by small tokens over the group (``same_host``);
every other pair uses the sockets.

``NaiveExecutor`` is the correctness oracle and the "planner off" baseline: for each parameter,
source rank 0 gathers the full tensor from the other sources, broadcasts it to the whole group,
and every destination slices what it needs.

Both are built once per group and plan and called with ``sync`` at every weight update. Both
check every sync before they return a destination's tensors: each slice (``DistExecutor``) or
each full tensor (``NaiveExecutor``) as it landed against what its source sent, by exact
fingerprints (``checked``); a difference raises ``DeliveryFailed`` naming the tensor.
Executors know tensors and the group; they do not know services, RPCs or policy versions.
The oracle stays beside the executor it checks (about 470 lines together): they share the
plan walk, the payload sums and the construction (``make_executor``); the parts each uses
alone (``same_host``, ``delta``, ``checked``, ``replay``) are modules of their own.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from hybridflow.errors import DeliveryFailed
from hybridflow.resharding.plan import TransferPlan
from hybridflow.resharding.topology import fsdp_dim0_rows, part_slices
from hybridflow.weights.transport.checked import LandedSlices, SentSlices, check_tag
from hybridflow.weights.transport.delta import (
    DeltaCounts,
    DeltaDestination,
    DeltaSource,
    payload_bytes,
)
from hybridflow.weights.transport.fingerprint import CHUNK_ELEMENTS, fingerprint
from hybridflow.weights.transport.group import WeightSyncGroup
from hybridflow.weights.transport.reference import allocate_destination, torch_dtype
from hybridflow.weights.transport.replay import (
    RankBucket,
    check_destination,
    check_source_shards,
    pack,
    rank_buckets,
    unpack,
)
from hybridflow.weights.transport.same_host import SharedDestinations, SharedSources, connect_shared

Tensors = Mapping[str, torch.Tensor]

CHECK_THREADS = 2
"""Threads a destination fingerprints what same-host sources wrote with (they are done and
idle by then; a 0.5B fp32 model's 2 GB take ~0.2 s on one thread here)."""


@dataclass(frozen=True)
class SyncStats:
    """What one rank did in one sync."""

    rank: int
    """Group rank."""
    is_source: bool
    """True on learner ranks."""
    num_bytes_sent: int
    """Payload bytes this rank sent."""
    num_bytes_received: int
    """Payload bytes this rank received."""
    num_messages: int
    """Point-to-point messages or broadcasts this rank took part in."""
    seconds: float
    """Wall time of the sync on this rank (device work included)."""
    num_bytes_shared: int = 0
    """Of the bytes sent or received, those that went through shared memory (same host)."""


@dataclass(frozen=True)
class SyncResult:
    """A sync's outcome on one rank."""

    tensors: dict[str, torch.Tensor]
    """Destination ranks: destination name -> local tensor. Source ranks: empty."""
    stats: SyncStats
    """Counters for this rank."""


def _check_group(plan: TransferPlan, group: WeightSyncGroup) -> None:
    if group.world_size != plan.world_size:
        raise ValueError(
            f"group: world size {group.world_size} != plan world size {plan.world_size} "
            f"({plan.num_src_ranks} sources + replicas {list(plan.replicas)})"
        )


def _finish(group: WeightSyncGroup, start: float) -> float:
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)
    return time.perf_counter() - start


class DistExecutor:
    """Planned, bucketed, double-buffered point-to-point executor."""

    def __init__(
        self,
        plan: TransferPlan,
        group: WeightSyncGroup,
        num_buffers: int = 2,
        *,
        shared_memory: bool = False,
        group_name: str = "group",
        check: bool = True,
        delta: bool = False,
        sample: int = 0,
    ) -> None:
        """``num_buffers``: socket buckets in flight per rank. ``shared_memory``: offer
        same-host pairs a shared staging buffer (collective: every rank of the group builds its
        executor, whatever it offers). ``group_name`` goes into segment names, so it should be
        unique per group (a rebuilt group gets a new one). ``check``: fingerprint every slice
        on both sides (``checked``); every rank of the group must pass the same (off only to
        measure what the check costs). ``delta``: after the first sync, socket buckets carry
        only what changed (``delta``); every rank must pass the same. ``sample``: after the
        group's first sync (checked whole), the check reads ``sample`` elements of each slice
        instead of every byte (``sampled_fingerprint``); 0 (and with ``delta``, whose decoding
        the whole check vouches for): every byte at every sync; every rank the same."""
        _check_group(plan, group)
        self.check = check
        self.sample = 0 if delta else sample
        if num_buffers < 1:
            raise ValueError(f"num_buffers: need >= 1, got {num_buffers}")
        self.plan, self.group, self.role = plan, group, plan.role(group.rank)
        self.buckets = rank_buckets(plan, group.rank)
        self._shared = connect_shared(group, group_name, plan, self.buckets, shared_memory)
        shared = self.shared_peers
        size = max((b.num_bytes for b in self.buckets if b.peer not in shared), default=0)
        self._num_bytes_shared = sum(_payload(b) for b in self.buckets if b.peer in shared)
        self._buffers = [
            torch.empty(size, dtype=torch.uint8, device=group.device) for _ in range(num_buffers)
        ]
        self._num_syncs = 0
        over_sockets = any(b.peer not in shared for b in self.buckets)
        self._delta_source = (
            DeltaSource() if delta and over_sockets and self.role.is_source else None
        )
        self._delta_destination = (
            DeltaDestination() if delta and over_sockets and not self.role.is_source else None
        )
        self.last_delta: DeltaCounts | None = None
        """What the last sync's delta buckets held on this rank (None: it sent them whole)."""

    @property
    def shared_peers(self) -> tuple[int, ...]:
        """Group ranks this rank exchanges with through shared memory."""
        return () if self._shared is None else self._shared.peers

    def sync(self, tensors: Tensors | None = None) -> SyncResult:
        """Sources: pass local FSDP shards. Destinations: pass preallocated outputs or None.

        With same-host sources, a destination's result tensors (for None) are views of a
        shared staging buffer: valid as long as they are referenced, and that buffer is not
        reused before then (``same_host``). Passing an earlier result back overwrites it in
        place."""
        start = time.perf_counter()
        self._num_syncs += 1
        if self.role.is_source:
            if tensors is None:
                raise ValueError("tensors: a source rank must pass its local shards")
            check_source_shards(self.plan, self.role.src_rank, tensors)
            sent = self._send(tensors)
            stats = SyncStats(self.group.rank, True, sent, 0, len(self.buckets), 0.0)
            out: dict[str, torch.Tensor] = {}
        else:
            out, received = self._receive(tensors)
            stats = SyncStats(self.group.rank, False, 0, received, len(self.buckets), 0.0)
        seconds = _finish(self.group, start)
        stats = dataclasses.replace(stats, seconds=seconds, num_bytes_shared=self._num_bytes_shared)
        return SyncResult(out, stats)

    def close(self) -> None:
        """Unmap the shared segments (the group itself belongs to the caller); results
        handed out earlier stay valid."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def _sampled(self) -> tuple[int, int] | None:
        """(elements per slice, salt) when this sync's check samples; None: every byte (the
        group's first sync, or ``sample`` 0). Both ends count the group's syncs alike."""
        if self.sample <= 0 or self._num_syncs <= 1:
            return None
        return self.sample, self._num_syncs

    def _send(self, shards: Tensors) -> int:
        shared = self._shared if isinstance(self._shared, SharedDestinations) else None
        if shared is not None:
            shared.begin()
        sent = (
            SentSlices(self.group, check_tag(self.plan.num_buckets), self._sampled())
            if self.check
            else None
        )
        delta = self._delta_source if self._delta_source and self._delta_source.has_base else None
        counts = DeltaCounts()
        self.last_delta = None
        inflight: deque[tuple[list[torch.distributed.Work], torch.Tensor, torch.Tensor]] = deque()
        pending: deque[torch.distributed.Work] = deque()
        total, nbuf, k = 0, len(self._buffers), 0  # k: socket buckets so far (buffer index)
        written: list[RankBucket] = []  # to shared memory: checked while the replica copies
        for bucket in self.buckets:
            total += _payload(bucket)
            if shared is not None and bucket.peer in shared.destinations:
                shared.write(bucket, shards, self._num_syncs)
                written.append(bucket)
                continue
            if delta is not None:
                while len(inflight) >= nbuf:  # bounds the encoded buckets held at once
                    for work in inflight.popleft()[0]:
                        work.wait()
                header, payload, bucket_counts = delta.encode(bucket, shards)
                counts.add(bucket_counts)
                works = [self.group.send(header, bucket.peer, bucket.bucket_id)]
                if payload.numel():
                    tag = delta_tag(self.plan.num_buckets, bucket.bucket_id)
                    works.append(self.group.send(payload, bucket.peer, tag))
                inflight.append((works, header, payload))  # alive until their sends end
            else:
                if len(pending) == nbuf:
                    pending.popleft().wait()  # frees the buffer bucket k reuses
                buffer = _direct_view(bucket, shards)
                if buffer is None:
                    buffer = self._buffers[k % nbuf][: bucket.num_bytes]
                    pack(bucket, shards, buffer)
                pending.append(self.group.send(buffer, bucket.peer, bucket.bucket_id))
                k += 1
            if sent is not None:  # while the bucket is on the wire
                sent.add(bucket, shards)
        for work in pending:
            work.wait()
        for works, _, _ in inflight:
            for work in works:
                work.wait()
        if shared is not None:
            shared.finish()
        if sent is not None:
            sent.add_all(written, shards, threads=1)  # the shards stay until the sync ends
            sent.send()
            sent.wait()
        if self._delta_source is not None:  # the base of the next delta
            self._delta_source.remember(shards)
        if delta is not None:
            self.last_delta = counts
            return total - _socket_payload(self.buckets, shared) + counts.num_bytes
        return total

    def _receive(self, tensors: Tensors | None) -> tuple[dict[str, torch.Tensor], int]:
        shared = self._shared if isinstance(self._shared, SharedSources) else None
        if tensors is not None:
            check_destination(self.plan, self.role.replica, self.role.tp_rank, tensors)
        if shared is not None:
            out = shared.begin(self._num_syncs, tensors)
        elif tensors is not None:
            out = dict(tensors)
        else:
            role = self.role
            out = allocate_destination(self.plan, role.replica, role.tp_rank, self.group.device)
        peers = shared.peers if shared is not None else ()
        buckets = [b for b in self.buckets if b.peer not in peers]  # over the sockets
        landed = (
            LandedSlices(
                self.group, check_tag(self.plan.num_buckets), self.buckets, self._sampled()
            )
            if self.check
            else None
        )
        delta = self._delta_destination
        if delta is not None and delta.has_base:
            over_sockets = self._receive_deltas(buckets, out, landed)
        else:
            self._receive_whole(buckets, out, landed)
            over_sockets = sum(_payload(b) for b in buckets)
        if shared is not None:
            shared.finish(self._num_syncs, out)
        if landed is not None:
            shared_buckets = [b for b in self.buckets if b.peer in peers]
            landed.add_all(shared_buckets, out, threads=CHECK_THREADS)
            landed.verify()
        if delta is not None and not delta.has_base:  # a full sync, checked: the next's base
            delta.remember(out)
        return out, over_sockets + sum(_payload(b) for b in self.buckets if b.peer in peers)

    def _receive_whole(
        self,
        buckets: list[RankBucket],
        out: dict[str, torch.Tensor],
        landed: LandedSlices | None,
    ) -> None:
        """The socket buckets as they are: ``num_buffers`` receives posted ahead, each bucket
        unpacked (or landed in place) and fingerprinted while the next is on the wire."""
        nbuf = len(self._buffers)
        posted: deque[torch.distributed.Work] = deque()

        def post(k: int) -> None:
            b = buckets[k]
            buffer = _direct_view(b, out)
            if buffer is None:
                buffer = self._buffers[k % nbuf][: b.num_bytes]
            posted.append(self.group.recv(buffer, b.peer, b.bucket_id))

        for k in range(min(nbuf, len(buckets))):
            post(k)
        for k, bucket in enumerate(buckets):
            posted.popleft().wait()
            if _direct_view(bucket, out) is None:  # else it landed in place
                unpack(bucket, self._buffers[k % nbuf][: bucket.num_bytes], out)
            if k + nbuf < len(buckets):
                post(k + nbuf)
            if landed is not None:
                landed.add(bucket, out)

    def _receive_deltas(
        self,
        buckets: list[RankBucket],
        out: dict[str, torch.Tensor],
        landed: LandedSlices | None,
    ) -> int:
        """The socket buckets of a delta sync, one after the other (header, then the payload
        it announces), each decoded onto the base and fingerprinted; the bytes received."""
        delta = self._delta_destination
        assert delta is not None
        counts = DeltaCounts()
        for bucket in buckets:
            header = torch.empty(len(bucket.ops), dtype=torch.int64, device=self.group.device)
            self.group.recv(header, bucket.peer, bucket.bucket_id).wait()
            size = payload_bytes(bucket.ops, header)
            payload = torch.empty(size, dtype=torch.uint8, device=self.group.device)
            if size:
                tag = delta_tag(self.plan.num_buckets, bucket.bucket_id)
                self.group.recv(payload, bucket.peer, tag).wait()
            counts.num_changed += delta.decode(bucket, header, payload, out)
            counts.num_elements += sum(op.num_bytes // op.dtype.itemsize for op in bucket.ops)
            counts.num_bytes += header.numel() * 8 + size
            if landed is not None:
                landed.add(bucket, out)
        self.last_delta = counts
        return counts.num_bytes


def _payload(bucket: RankBucket) -> int:
    return sum(op.num_bytes for op in bucket.ops)


def _socket_payload(buckets: list[RankBucket], shared: SharedDestinations | None) -> int:
    """Of ``buckets``' payload, what a full sync sends over the sockets."""
    peers = shared.destinations if shared is not None else {}
    return sum(_payload(b) for b in buckets if b.peer not in peers)


def delta_tag(num_buckets: int, bucket_id: int) -> int:
    """The tag of a delta bucket's payload (its header goes under the bucket's id): above
    the same-host tokens' and the fingerprints' tags (``checked.check_tag``)."""
    return num_buckets + 3 + bucket_id


def _direct_view(bucket: RankBucket, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The bytes of a one-slice bucket in place, when that slice is contiguous: it is sent
    from (or received into) the tensor itself, skipping two copies. The bytes on the wire are
    the same as a packed bucket's, so each side decides on its own."""
    if len(bucket.ops) != 1:
        return None
    op = bucket.ops[0]
    if op.offset != 0 or op.num_bytes != bucket.num_bytes:
        return None
    view = tensors[op.name][op.index]
    if not view.is_contiguous() or view.numel() == 0:
        return None
    return view.reshape(-1).view(torch.uint8)


class NaiveExecutor:
    """Gather each full tensor on source rank 0, broadcast it to the group, slice locally."""

    def __init__(self, plan: TransferPlan, group: WeightSyncGroup) -> None:
        _check_group(plan, group)
        self.plan, self.group, self.role = plan, group, plan.role(group.rank)
        topo = plan.topology
        self._uses: dict[str, list[tuple[str, tuple[slice, ...], tuple[slice, ...]]]] = {}
        if not self.role.is_source:
            tp = plan.replicas[self.role.replica]
            for dest in topo.dests:
                for i, part in enumerate(dest.parts):
                    src, dst = part_slices(topo, dest, i, tp, self.role.tp_rank)
                    self._uses.setdefault(part.source, []).append((dest.name, src, dst))
        size = max((p.num_bytes for p in topo.params), default=0)
        self._buffer = torch.empty(size, dtype=torch.uint8, device=group.device)
        self._scratch = torch.empty(CHUNK_ELEMENTS, dtype=torch.int32, device=group.device)

    def _check(self, fingerprints: list[tuple[int, int]]) -> None:
        """Source rank 0 broadcasts the fingerprint of every full tensor it broadcast; a
        destination raises ``DeliveryFailed`` at the first that differs from its own."""
        params = self.plan.topology.params
        sent = torch.zeros((len(params), 2), dtype=torch.int64, device=self.group.device)
        if self.group.rank == 0:
            sent.copy_(torch.tensor(fingerprints, dtype=torch.int64).reshape(-1, 2))
        self.group.broadcast(sent, 0).wait()
        if self.role.is_source:
            return
        for spec, want, got in zip(params, sent.cpu().tolist(), fingerprints, strict=True):
            if tuple(want) != got:
                raise DeliveryFailed(
                    f"tensor {spec.name} did not arrive as learner rank 0 broadcast it: its "
                    "bytes here differ from the learner's"
                )

    def sync(self, tensors: Tensors | None = None) -> SyncResult:
        """Same contract as ``DistExecutor.sync``."""
        start = time.perf_counter()
        role, plan, group = self.role, self.plan, self.group
        out: dict[str, torch.Tensor] = {}
        shards: Tensors = {}
        if role.is_source:
            if tensors is None:
                raise ValueError("tensors: a source rank must pass its local shards")
            check_source_shards(plan, role.src_rank, tensors)
            shards = tensors
        elif tensors is None:
            out = allocate_destination(plan, role.replica, role.tp_rank, group.device)
        else:
            check_destination(plan, role.replica, role.tp_rank, tensors)
            out = dict(tensors)
        sent = received = messages = 0
        fingerprints: list[tuple[int, int]] = []
        for tag, spec in enumerate(plan.topology.params):
            full = self._buffer[: spec.num_bytes].view(torch_dtype(spec.dtype)).view(spec.shape)
            rows = fsdp_dim0_rows(spec.shape[0], plan.num_src_ranks)
            if role.is_source and role.src_rank == 0:
                full[rows[0][0] : rows[0][1]].copy_(shards[spec.name])
                works = [
                    group.recv(full[a:b], s, tag)
                    for s, (a, b) in enumerate(rows)
                    if s > 0 and b > a
                ]
                for work in works:
                    work.wait()
                received += sum((b - a) for a, b in rows[1:]) * spec.num_bytes // spec.shape[0]
                messages += len(works)
            elif role.is_source and rows[role.src_rank][1] > rows[role.src_rank][0]:
                shard = shards[spec.name].contiguous()
                group.send(shard, 0, tag).wait()
                sent += shard.numel() * shard.element_size()
                messages += 1
            group.broadcast(full, 0).wait()
            messages += 1
            if group.rank == 0:  # a broadcast counts once for the root, once per receiver
                sent += spec.num_bytes
            else:
                received += spec.num_bytes
            if group.rank == 0 or not role.is_source:
                fingerprints.append(fingerprint(full, self._scratch))
            for name, src, dst in self._uses.get(spec.name, []):
                out[name][dst].copy_(full[src])
        self._check(fingerprints)
        stats = SyncStats(group.rank, role.is_source, sent, received, messages, 0.0)
        seconds = _finish(group, start)
        return SyncResult(out, dataclasses.replace(stats, seconds=seconds))

    def close(self) -> None:
        """Nothing to release besides the group (the caller's): the oracle uses sockets only."""
