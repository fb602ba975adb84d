"""The weight-sync process group: learner ranks plus rollout TP ranks, outside the default group.

The learner already owns the default process group (its FSDP mesh), and rollout workers live
in other processes with their own, so the weight-sync group cannot come from ``dist.new_group``.
It is a standalone c10d backend object (``ProcessGroupGloo`` / ``ProcessGroupNCCL``) built on
its own ``TCPStore`` rendezvous, the same approach as vLLM's stateless process groups. Ranks
call the backend's ``send`` / ``recv`` / ``broadcast`` methods directly; the functional
``torch.distributed.*`` API is never used on it, and the default group is never touched.

NCCL: every rank calls ``eager_connect_single_device`` at creation, so point-to-point ops use
the group's single full communicator (no lazily created two-rank communicators, whose blocking
initialisation could interlock). NCCL ops do not time out on their own: the caller's control
RPC keeps the deadline and calls ``abort()`` then rebuilds the group on failure.
This module knows rendezvous and backends; of plans only their hash and parameter names.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

BACKENDS = ("gloo", "nccl")


class P2PBackend(Protocol):
    """The c10d backend methods used here (bound at runtime; torch's stubs omit most)."""

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work: ...

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work: ...

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...

    def abort(self) -> None: ...

    def shutdown(self) -> None: ...


@dataclass
class WeightSyncGroup:
    """A live weight-sync group as seen by one rank."""

    rank: int
    """This process's rank in the group (sources first, then destination ranks)."""
    world_size: int
    """Number of ranks in the group."""
    backend: str
    """"gloo" or "nccl"."""
    device: torch.device
    """Device holding the tensors this rank communicates (cpu for gloo, cuda:i for nccl)."""
    store: dist.Store
    """The group's key-value store (prefixed by the group name)."""
    pg: P2PBackend
    """The c10d backend object; call ``send``/``recv``/``broadcast`` on it."""
    timeout_s: float
    """Timeout given to the store and the backend (gloo honours it; NCCL is asynchronous)."""

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work:
        return self.pg.send([tensor], dst, tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> dist.Work:
        return self.pg.recv([tensor], src, tag)

    def broadcast(self, tensor: torch.Tensor, root: int) -> dist.Work:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        return self.pg.broadcast([tensor], opts)

    def barrier(self) -> None:
        """A store-free barrier through the backend (a 1-element broadcast from rank 0)."""
        self.broadcast(torch.zeros(1, device=self.device), 0).wait()

    def abort(self) -> None:
        """Abort in-flight work (used when a sync's deadline passes); the group is dead after."""
        self.pg.abort()

    def close(self) -> None:
        self.pg.shutdown()


def init_weight_sync_group(
    master_addr: str,
    master_port: int,
    world_size: int,
    rank: int,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    *,
    group_name: str = "weight_sync",
    is_store_host: bool | None = None,
    device: torch.device | str | None = None,
    local_addr: str | None = None,
    listen_fd: int | None = None,
    abandon: Callable[[], str | None] | None = None,
    linger: Callable[[], object] | None = None,
) -> WeightSyncGroup:
    """Join (and, on the store host, serve) a weight-sync group of ``world_size`` ranks.

    ``is_store_host`` defaults to ``rank == 0``; pass False on every rank when some other
    process already serves a ``TCPStore`` at ``master_addr:master_port``. ``group_name``
    prefixes every store key so a rebuilt group never reads a previous one's keys.
    ``local_addr``: the address gloo binds on this rank (default: resolve the hostname).
    ``listen_fd``: the store host serves on this already-listening socket (bound to the
    interface the caller chose) instead of binding all interfaces itself.

    Every rank first waits in the store until all have arrived (``arrive``), so a rank that
    will never come fails the group at once instead of after ``timeout_s``: ``abandon`` (the
    publisher's rank 0 watching the replicas' join calls) returns a reason once one of them
    refused, and every waiting rank then raises with it. ``linger`` runs on the abandoning
    rank before it raises (and, as the store host, takes the store down): it waits for the
    others to have read the reason, so none is left retrying a store that is gone.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} not in [0, world_size={world_size})")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
    timeout = datetime.timedelta(seconds=timeout_s)
    host = rank == 0 if is_store_host is None else is_store_host
    store = dist.TCPStore(
        master_addr, master_port, world_size, is_master=host, timeout=timeout,
        wait_for_workers=False, master_listen_fd=listen_fd if host else None,
    )  # fmt: skip
    prefixed = dist.PrefixStore(f"{group_name}/", store)
    arrive(prefixed, rank, world_size, timeout_s, abandon, linger)
    if backend == "gloo":
        dev = torch.device("cpu" if device is None else device)
        # The options constructor (to bind a given address) exists at runtime, not in the stubs.
        opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._timeout = timeout
        opts._devices = [
            ProcessGroupGloo.create_device(hostname=local_addr)
            if local_addr
            else ProcessGroupGloo.create_default_device()
        ]
        backend_obj: object = ProcessGroupGloo(prefixed, rank, world_size, opts)
    else:
        if not dist.is_nccl_available() or not torch.cuda.is_available():
            raise ValueError("backend: nccl needs a CUDA build of torch and a visible GPU")
        dev = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
        if dev.type != "cuda" or dev.index is None:
            raise ValueError(f"device: nccl needs an indexed cuda device, got {dev}")
        torch.cuda.set_device(dev)
        from torch.distributed import ProcessGroupNCCL

        nccl_opts = ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        nccl_opts.is_high_priority_stream = False
        nccl_pg = ProcessGroupNCCL(prefixed, rank, world_size, nccl_opts)
        nccl_pg.eager_connect_single_device(dev)
        backend_obj = nccl_pg
    pg = cast(P2PBackend, backend_obj)
    return WeightSyncGroup(rank, world_size, backend, dev, prefixed, pg, timeout_s)


ABANDONED = "abandoned"
_ARRIVAL_POLL_S = 0.05


def arrive(
    store: dist.Store,
    rank: int,
    world_size: int,
    timeout_s: float,
    abandon: Callable[[], str | None] | None = None,
    linger: Callable[[], object] | None = None,
) -> None:
    """Mark this rank arrived and wait for every other one. RuntimeError as soon as the group
    is abandoned (``abandon`` here, or on another rank, gave a reason; here ``linger`` runs
    first); TimeoutError naming the missing ranks after ``timeout_s``."""
    store.set(f"arrived/{rank}", "1")
    keys = [f"arrived/{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        reason = abandon() if abandon is not None else None
        if reason:
            store.set(ABANDONED, reason)
            if linger is not None:
                linger()
        if store.check([ABANDONED]):
            raise RuntimeError(f"weight-sync group abandoned: {store.get(ABANDONED).decode()}")
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise TimeoutError(
                f"weight-sync group: ranks {missing} did not join within {timeout_s:g}s"
            )
        time.sleep(_ARRIVAL_POLL_S)


def check_plan_hash(
    group: WeightSyncGroup,
    plan_hash: str,
    tag: str = "0",
    params: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Every rank publishes its plan hash and checks all others'; RuntimeError on mismatch.

    ``tag`` distinguishes successive checks on the same group (e.g. a re-plan). ``params``
    (the plan's parameter names and shapes) is published beside the hash, so that a mismatch
    names the parameters the two plans disagree on (whole-tensor plans at TP 1 come from each
    side's own table: a parameter only one side has shows up here).
    """
    if params is not None:  # set before the hash: whoever sees the hash can read them
        group.store.set(f"plan_params/{tag}/{group.rank}", json.dumps(dict(params)))
    group.store.set(f"plan_hash/{tag}/{group.rank}", plan_hash)
    keys = [f"plan_hash/{tag}/{r}" for r in range(group.world_size)]
    group.store.wait(keys)
    values = [v.decode() for v in group.store.multi_get(keys)]
    bad = [r for r, v in enumerate(values) if v != plan_hash]
    if bad:
        raise RuntimeError(
            f"plan hash mismatch: rank {group.rank} has {plan_hash[:12]}, ranks {bad} have "
            f"{sorted({values[r][:12] for r in bad})}{_param_difference(group, tag, bad[0], params)}"
        )


def _param_difference(
    group: WeightSyncGroup, tag: str, other: int, params: Mapping[str, Sequence[int]] | None
) -> str:
    """``; <what differs>`` between this rank's plan parameters and rank ``other``'s, or ""
    when either did not publish them or they agree (the plans differ elsewhere)."""
    key = f"plan_params/{tag}/{other}"
    if params is None or not group.store.check([key]):
        return ""
    theirs = {n: tuple(s) for n, s in json.loads(group.store.get(key)).items()}
    mine = {n: tuple(s) for n, s in params.items()}
    parts = []
    for holder, names in (
        (group.rank, sorted(set(mine) - set(theirs))),
        (other, sorted(set(theirs) - set(mine))),
    ):
        if names:
            shown = ", ".join(repr(n) for n in names[:5])
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            parts.append(f"only rank {holder}'s plan has {shown}{more}")
    parts += [
        f"{n} is {mine[n]} on rank {group.rank}, {theirs[n]} on rank {other}"
        for n in sorted(set(mine) & set(theirs))
        if mine[n] != theirs[n]
    ][:1]
    return f"; {'; '.join(parts)}" if parts else ""
