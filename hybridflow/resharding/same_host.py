"""Same-host pairs of a planned sync: buckets through a shared-memory segment, not a socket.

Which pairs: a (source rank, destination rank) pair of a plan with buckets between them whose
two ranks published the same host identity (``shm.host_identity``) in the group's store. A
rank opts out by publishing "" (shared memory off, or a device without a shared segment).
Setup is collective over the store, every wait bounded by the store's timeout:

1. every rank publishes its identity and reads everyone's;
2. for each candidate pair the source removes stale segments, creates one of
   ``slots x largest bucket`` bytes (0600), writes a random nonce at its start and publishes
   the name and nonce;
3. the destination opens it, checks size and nonce, publishes "1" (or "0" if it cannot see
   the segment: another ``/dev/shm``, another user);
4. the source unlinks the name either way; on "0" the pair stays on sockets.

Per sync, per bucket of a shared pair (slot = the bucket's position among the pair's buckets
modulo the slot count): the source waits for the ack that freed the slot, packs the bucket's
slices into it and sends a token ``(sync number, bucket id)`` over the group with the bucket's
tag; the destination receives the token, checks it, unpacks from the slot and returns the token
as the ack (tag + number of buckets). Tokens travel over the same group in the same global
bucket order as the data would, so the executor's deadlock argument and the group's timeouts
carry over, and the slices moved are exactly the plan's.

Devices: only CPU tensors share a segment today (POSIX shared memory). A CUDA IPC segment
(an allocation exported with torch's CUDA IPC handles, exchanged through the store) would
implement ``Segment``'s three members and add "cuda" to ``SHARED_DEVICE_TYPES``.
This module knows pairs, slots and tokens; the executor decides which bucket goes where.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from hybridflow.resharding.group import WeightSyncGroup
from hybridflow.resharding.replay import RankBucket, pack, unpack
from hybridflow.resharding.shm import (
    Segment,
    aligned,
    host_identity,
    remove_stale_segments,
    segment_name,
)

log = logging.getLogger(__name__)

SHARED_DEVICE_TYPES = ("cpu",)
NONCE_BYTES = 16


@dataclass
class SharedPair:
    """One same-host pair as seen by one of its two ranks."""

    peer: int
    """Group rank on the other side."""
    segment: Segment
    """The mapped segment (its name already unlinked)."""
    slot_bytes: int
    """Bytes per slot (the pair's largest bucket, 64-byte aligned)."""
    num_slots: int
    """Buckets in flight at once."""
    acks: deque[tuple[torch.distributed.Work, torch.Tensor, int]] = field(default_factory=deque)
    """Source side: (work, buffer, bucket id) of acks not yet waited for, oldest first."""

    def slot(self, position: int, num_bytes: int) -> torch.Tensor:
        start = (position % self.num_slots) * self.slot_bytes
        return self.segment.tensor[start : start + num_bytes]


def _token(sync: int, bucket_id: int) -> torch.Tensor:
    return torch.tensor([sync, bucket_id], dtype=torch.int64)


def check_token(token: torch.Tensor, sync: int, bucket_id: int, what: str) -> None:
    """RuntimeError unless a received token is (sync, bucket id): the two sides disagree."""
    got = [int(v) for v in token.tolist()]
    if got != [sync, bucket_id]:
        raise RuntimeError(
            f"shared memory {what}: expected (sync, bucket) {[sync, bucket_id]}, got {got}"
        )


class SharedLinks:
    """This rank's shared pairs for one executor, and the token protocol over them."""

    def __init__(self, group: WeightSyncGroup, pairs: dict[int, SharedPair], num_buckets: int):
        self.group, self.pairs, self._ack_offset = group, pairs, num_buckets
        self._sends: list[tuple[torch.distributed.Work, torch.Tensor]] = []

    # source side ---------------------------------------------------------------------------
    def send(
        self, bucket: RankBucket, position: int, shards: Mapping[str, torch.Tensor], sync: int
    ) -> None:
        """Pack a bucket into its slot (once the slot's previous bucket was acked); signal."""
        pair = self.pairs[bucket.peer]
        if len(pair.acks) == pair.num_slots:
            self._wait_ack(pair, sync)
        pack(bucket, shards, pair.slot(position, bucket.num_bytes))
        token = _token(sync, bucket.bucket_id)
        self._sends.append((self.group.send(token, bucket.peer, bucket.bucket_id), token))
        ack = torch.empty(2, dtype=torch.int64)
        tag = bucket.bucket_id + self._ack_offset
        pair.acks.append((self.group.recv(ack, bucket.peer, tag), ack, bucket.bucket_id))

    def finish_send(self, sync: int) -> None:
        """Every token delivered and every bucket acked (the destination copied it out)."""
        self._drain_sends()
        for pair in self.pairs.values():
            while pair.acks:
                self._wait_ack(pair, sync)

    def _wait_ack(self, pair: SharedPair, sync: int) -> None:
        work, ack, bucket_id = pair.acks.popleft()
        work.wait()
        check_token(ack, sync, bucket_id, f"ack from rank {pair.peer}")

    # destination side ----------------------------------------------------------------------
    def post_token(self, bucket: RankBucket) -> tuple[torch.distributed.Work, torch.Tensor]:
        """Post the receive of a bucket's token (ahead of time, like a data receive)."""
        token = torch.empty(2, dtype=torch.int64)
        return self.group.recv(token, bucket.peer, bucket.bucket_id), token

    def receive(
        self,
        bucket: RankBucket,
        position: int,
        token: torch.Tensor,
        out: Mapping[str, torch.Tensor],
        sync: int,
    ) -> None:
        """After the token arrived: check it, copy the bucket out of its slot, ack it."""
        check_token(token, sync, bucket.bucket_id, f"token from rank {bucket.peer}")
        unpack(bucket, self.pairs[bucket.peer].slot(position, bucket.num_bytes), out)
        tag = bucket.bucket_id + self._ack_offset
        self._sends.append((self.group.send(token, bucket.peer, tag), token))

    def finish_receive(self) -> None:
        self._drain_sends()

    def _drain_sends(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()

    def close(self) -> None:
        self._sends.clear()
        for pair in self.pairs.values():
            pair.acks.clear()
            pair.segment.close()
        self.pairs = {}


def connect_shared_pairs(
    group: WeightSyncGroup,
    group_name: str,
    buckets: Sequence[RankBucket],
    is_source: bool,
    num_slots: int,
    enabled: bool,
) -> dict[int, SharedPair]:
    """Collective setup (every rank of the group calls it once per executor): the pairs of
    this rank that move through shared memory, keyed by peer. See the module docstring."""
    tag = int(group.store.add(f"shm/executors/{group.rank}", 1))
    prefix = f"shm/{tag}"
    offer = enabled and group.device.type in SHARED_DEVICE_TYPES
    group.store.set(f"{prefix}/host/{group.rank}", host_identity() if offer else "")
    keys = [f"{prefix}/host/{r}" for r in range(group.world_size)]
    group.store.wait(keys)
    hosts = [v.decode() for v in group.store.multi_get(keys)]
    sizes: dict[int, list[int]] = {}
    for b in buckets:
        sizes.setdefault(b.peer, []).append(b.num_bytes)
    mine = hosts[group.rank]
    candidates = {p: s for p, s in sizes.items() if mine and hosts[p] == mine}
    if not candidates:
        return {}
    if is_source:
        return _create(group, f"{group_name}-e{tag}", prefix, candidates, num_slots)
    return _attach(group, prefix, candidates, num_slots)


def _layout(sizes: list[int], num_slots: int) -> tuple[int, int]:
    slots = min(num_slots, len(sizes))
    return aligned(max(max(sizes), NONCE_BYTES)), slots


def _create(
    group: WeightSyncGroup,
    group_name: str,
    prefix: str,
    candidates: dict[int, list[int]],
    num_slots: int,
) -> dict[int, SharedPair]:
    for name in remove_stale_segments():
        log.warning("removed a stale shared-memory segment /dev/shm/%s", name)
    pairs: dict[int, SharedPair] = {}
    try:
        for peer, sizes in candidates.items():
            slot_bytes, slots = _layout(sizes, num_slots)
            segment = Segment(segment_name(group_name, group.rank, peer), slot_bytes * slots, True)
            pairs[peer] = SharedPair(peer, segment, slot_bytes, slots)
            nonce = secrets.token_bytes(NONCE_BYTES)
            segment.tensor[:NONCE_BYTES].copy_(
                torch.frombuffer(bytearray(nonce), dtype=torch.uint8)
            )
            group.store.set(f"{prefix}/seg/{group.rank}/{peer}", f"{segment.name}|{nonce.hex()}")
        for peer in list(pairs):
            accepted = group.store.get(f"{prefix}/ok/{group.rank}/{peer}").decode() == "1"
            pairs[peer].segment.unlink()
            if not accepted:
                pairs.pop(peer).segment.close()
    except BaseException:
        for pair in pairs.values():
            pair.segment.close()
        raise
    return pairs


def _attach(
    group: WeightSyncGroup, prefix: str, candidates: dict[int, list[int]], num_slots: int
) -> dict[int, SharedPair]:
    pairs: dict[int, SharedPair] = {}
    try:
        for peer, sizes in candidates.items():
            pair = _attach_one(group, prefix, peer, sizes, num_slots)
            if pair is not None:
                pairs[peer] = pair
    except BaseException:
        for pair in pairs.values():
            pair.segment.close()
        raise
    return pairs


def _attach_one(
    group: WeightSyncGroup, prefix: str, peer: int, sizes: list[int], num_slots: int
) -> SharedPair | None:
    name, nonce = group.store.get(f"{prefix}/seg/{peer}/{group.rank}").decode().split("|")
    slot_bytes, slots = _layout(sizes, num_slots)
    ok_key = f"{prefix}/ok/{peer}/{group.rank}"
    try:
        segment = Segment(name, slot_bytes * slots, False)
    except (FileNotFoundError, PermissionError) as exc:
        log.info("rank %d: no shared memory with rank %d (%s); sockets", group.rank, peer, exc)
        group.store.set(ok_key, "0")
        return None
    except BaseException:
        group.store.set(ok_key, "0")  # the source must not wait for an answer
        raise
    if bytes(segment.tensor[:NONCE_BYTES].tolist()).hex() != nonce:
        log.warning("rank %d: /dev/shm/%s is not rank %d's; sockets", group.rank, name, peer)
        segment.close()
        group.store.set(ok_key, "0")
        return None
    group.store.set(ok_key, "1")
    return SharedPair(peer, segment, slot_bytes, slots)
