"""Forming the weight-sync group: who meets where, with which plan, checked by every party.

Both ends of the meeting live here. The learner side (``form_group``, on every learner rank
together): rank 0 asks each replica its TP size and layout (``describe``) and refuses, named,
a replica that places a parameter otherwise than the learner's family registry entry
(``resharding.layout``) or replicas that hold different dtypes; it opens the TCPStore's
socket, and the learner ranks agree on rank 0's meeting point (port, a fresh group name, the
TP sizes, the refusal, the wire dtype) over their own group. Every learner rank then plans,
joins, checks the plan hash and builds its executor; rank 0 last waits for every replica's
join and compares its plan hash. The replica side (``join_group``, one per destination TP
rank) plans from the ``GroupSpec`` it was sent, joins, checks the same hash and builds its
executor. A formation that fails aborts what it built, then raises.

This module knows nothing of gRPC (replicas are reached through the ``join`` and
``describe`` callables) nor of sending: agreeing on a failure across learner ranks and the
sends are ``dist_publisher``'s, the receives ``dist_receiver``'s, the rendezvous and
backends ``transport.group``'s, the plans ``hybridflow.resharding``'s. Both ends stay in one
file (about 490 lines) because each checks what the other computes: the plan, its hash, the
layout a replica describes.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.resharding.coverage import check_learner_covered, check_same_params
from hybridflow.resharding.layout import ReplicaLayout, check_same_layout, layout_of
from hybridflow.resharding.plan import TransferPlan, make_plan
from hybridflow.resharding.topology import DestParam, DestPart, ParamSpec, Placement, Topology
from hybridflow.weights.config import CHECK_SAMPLES, WeightSyncConfig
from hybridflow.weights.spec import GroupSpec, ReplicaDescription
from hybridflow.weights.transport.executors import DistExecutor, NaiveExecutor
from hybridflow.weights.transport.group import (
    WeightSyncGroup,
    check_plan_hash,
    init_weight_sync_group,
)
from hybridflow.weights.transport.reference import torch_dtype

log = logging.getLogger(__name__)

ParamTable = Sequence[tuple[str, tuple[int, ...], str]]
"""(name, global shape, dtype) of every parameter, as ``param_table`` gives them."""
DescribeFn = Callable[[str], ReplicaDescription]
"""describe(target) -> that replica's TP size (each TP rank joins as a destination) and its
weight layout (family and placements, computed from the model it loaded)."""
JoinFn = Callable[[str, GroupSpec, int], str]
"""join(target, spec, replica_index) -> the replica's plan hash (blocks until formed)."""


def param_table(module: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, global shape, dtype) of every parameter, tied ones once, sorted by name."""
    return sorted(
        (name, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for name, p in module.named_parameters()
    )


def replicated_topology(table: ParamTable) -> Topology:
    """Destinations that hold whole tensors (TP 1: the HF engine)."""
    return Topology(
        params=tuple(ParamSpec(n, shape, dtype) for n, shape, dtype in table),
        dests=tuple(DestParam(n, (DestPart(n, Placement.REPLICATED),)) for n, _, _ in table),
    )


def weight_sync_topology(
    table: ParamTable,
    replica_tp_sizes: Sequence[int],
    sliced: Topology | None,
    whole: bool = False,
) -> Topology:
    """The topology both sides plan with: whole tensors when every replica is TP 1 (any
    model) or ``whole`` (LoRA adapters: every TP rank takes each whole, as vLLM's LoRA
    layers cut their part themselves), else each TP rank's slices as the model's family
    places them (``sliced``: the family's ``sliced_topology``; None when the model has no
    family in the registry)."""
    if whole or all(int(t) == 1 for t in replica_tp_sizes):
        return replicated_topology(table)
    if sliced is None:
        raise ValueError(
            "tensor-parallel rollout replicas need a model family from the registry "
            "(hybridflow/models/families/) for the resharding plan"
        )
    return sliced


def make_executor(
    kind: str,
    plan: TransferPlan,
    group: WeightSyncGroup,
    group_name: str,
    shared_memory: bool = True,
    delta: bool = False,
    check_samples: int = 0,
) -> DistExecutor | NaiveExecutor:
    """The executor every rank of the group builds (the planner's setup is collective).
    ``shared_memory``: this rank offers shared memory to its same-host peers; a pair uses it
    only when both offer (a learner with ``weight_sync.shared_memory: off`` offers nothing).
    ``delta``: the planner's socket buckets carry what changed after the first sync (the
    group's spec says so to every rank; the naive oracle always sends everything).
    ``check_samples``: after the first sync the check samples this many elements of each
    slice (0: every byte; the naive oracle always checks every byte)."""
    if kind == "planner":
        return DistExecutor(
            plan,
            group,
            shared_memory=shared_memory,
            group_name=group_name,
            delta=delta,
            sample=check_samples,
        )
    if kind == "naive":
        return NaiveExecutor(plan, group)
    raise ValueError(f"weight_sync.executor must be planner or naive, got {kind!r}")


def check_samples(config: WeightSyncConfig, backend: str) -> int:
    """Elements per slice the check of a group's later syncs reads (``weight_sync.check``;
    auto: sampled on gloo, exact on NCCL); 0: every byte."""
    sampled = config.check == "sampled" or (config.check == "auto" and backend == "gloo")
    return CHECK_SAMPLES if sampled else 0


def group_backend(config: WeightSyncConfig, device: torch.device) -> str:
    """The group's backend: ``weight_sync.backend``, or for ``auto`` NCCL on CUDA, else gloo."""
    if config.backend != "auto":
        return config.backend
    return "nccl" if device.type == "cuda" else "gloo"


def listen_socket(host: str) -> socket.socket:
    """A TCP socket listening on ``host`` only (OS-chosen port), for the group's TCPStore:
    torch's own store server would listen on every interface."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def route_address(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (what gloo binds and advertises to
    the group's other ranks). Resolving the host name instead can give an address the other
    hosts cannot reach (127.0.1.1 in /etc/hosts, another interface); the route to the store
    every rank already reaches is the one they share. Sends nothing (a UDP connect)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host.strip("[]"), port or 9))
        return str(probe.getsockname()[0])


class FormedGroup(NamedTuple):
    """A weight-sync group every party has checked, as one learner rank holds it."""

    group: WeightSyncGroup
    executor: DistExecutor | NaiveExecutor
    wire_dtype: torch.dtype | None
    """The replicas' dtype when it is not the learner's (shards are cast to it)."""


class _Meeting(NamedTuple):
    """What rank 0 learned of the replicas and where the group's store listens, as every
    learner rank has it."""

    port: int
    name: str
    tp_sizes: tuple[int, ...]
    dtype: str
    """The replicas' dtype ("" the learner's own)."""


def _meet(
    targets: tuple[str, ...],
    describe: DescribeFn | None,
    module: nn.Module,
    whole: bool,
    dtype: str,
    config: WeightSyncConfig,
    rank: int,
    world_size: int,
    learner_group: dist.ProcessGroup | None,
    generation: int,
) -> tuple[_Meeting, socket.socket | None]:
    """Rank 0 describes the replicas (refusing them whole, for a dtype other than ``dtype``
    among others) and opens the store's socket; every learner rank gets the same meeting, or
    raises the same ``ValueError`` before any replica is asked to join. The socket: rank 0's
    (None elsewhere)."""
    tp_sizes, dtype_0, refusal = (
        _describe(targets, describe, module, whole) if rank == 0 else ([], "", "")
    )
    if rank == 0 and not refusal and dtype and (dtype_0 or param_table(module)[0][2]) != dtype:
        refusal = (
            f"replicas hold their weights in different dtypes ({list(targets)}: "
            f"{dtype_0 or param_table(module)[0][2]}, the replicas already served: {dtype}); "
            "the learner sends one dtype: give every replica the same rollout.dtype"
        )
    store_socket = None
    if rank == 0 and not refusal:
        store_socket = listen_socket(config.store_host)
    meeting: list[Any] = [
        store_socket.getsockname()[1] if store_socket is not None else 0,
        f"ws{generation}-{uuid.uuid4().hex[:8]}",
        tp_sizes,
        refusal,
        dtype_0,
    ]
    if dist.is_initialized() and world_size > 1:
        # Learner ranks agree on rank 0's meeting point and replicas over their own group.
        dist.broadcast_object_list(meeting, src=0, group=learner_group)
    if meeting[3]:  # every learner rank refuses, before any replica is asked to join
        raise ValueError(str(meeting[3]))
    port, name, sizes, _, wire = meeting
    return _Meeting(int(port), str(name), tuple(sizes), str(wire)), store_socket


def _plan(
    module: nn.Module, meeting: _Meeting, whole: bool, world_size: int, bucket_bytes: int
) -> tuple[TransferPlan, torch.dtype | None]:
    """The transfer plan from this learner's parameters to the replicas met, and the dtype
    the shards are cast to before each sync (None: sent as they are). Sent in the replicas'
    dtype: a bf16 replica of an fp32 learner gets bf16 (half the bytes)."""
    own = param_table(module)
    wire = meeting.dtype or own[0][2]
    table = [(n, shape, wire) for n, shape, _ in own]
    wire_dtype = None if wire == own[0][2] else torch_dtype(wire)
    sliced = None if whole else _sliced_topology(module, meeting.tp_sizes, wire)
    topology = weight_sync_topology(table, meeting.tp_sizes, sliced, whole)
    check_learner_covered(topology, table)
    plan = make_plan(topology, world_size, list(meeting.tp_sizes), bucket_bytes)
    return plan, wire_dtype


def form_group(
    targets: tuple[str, ...],
    join: JoinFn | None,
    describe: DescribeFn | None,
    *,
    config: WeightSyncConfig,
    rank: int,
    world_size: int,
    module: nn.Module,
    device: torch.device,
    learner_group: dist.ProcessGroup | None,
    whole: bool,
    generation: int,
    pool: ThreadPoolExecutor,
    dtype: str = "",
) -> FormedGroup:
    """The learner side of a new group to ``targets``, on every learner rank together
    (``rank`` of ``world_size`` within ``learner_group``, None: the default group). ``join``
    and ``describe`` reach the replicas on rank 0 (None elsewhere; ``describe`` None: every
    replica is TP 1 and takes whole tensors, unchecked), through ``pool``'s threads.
    ``whole``: ``module`` holds LoRA adapters, which every replica TP rank takes whole.
    ``generation`` numbers the group's name. ``dtype``: the wire dtype the learner's other
    groups send ("" none), which these replicas must hold too. Raises ``ValueError`` on every
    rank for a refused replica, before any replica is asked to join."""
    backend = group_backend(config, device)
    meeting, store_socket = _meet(
        targets, describe, module, whole, dtype, config, rank, world_size, learner_group, generation
    )
    port, name, tp_sizes = meeting.port, meeting.name, meeting.tp_sizes
    plan, wire_dtype = _plan(module, meeting, whole, world_size, config.bucket_bytes)
    spec = GroupSpec(
        config.store_host,
        port,
        name,
        backend,
        world_size,
        tp_sizes,
        config.bucket_bytes,
        config.executor,
        config.timeout_s,
        config.delta,
        check_samples(config, backend),
    )
    joins: list[Future[str]] = []
    if rank == 0:
        assert join is not None
        joins = [pool.submit(join, t, spec, i) for i, t in enumerate(targets)]
    group = init_weight_sync_group(
        spec.store_host,
        port,
        plan.world_size,
        rank,
        spec.backend,
        spec.timeout_s,
        group_name=name,
        is_store_host=rank == 0,
        device=device if spec.backend == "nccl" else None,
        local_addr=route_address(spec.store_host, port),
        # The store takes ownership of the listening socket (and closes it with the group).
        listen_fd=store_socket.detach() if store_socket is not None else None,
        abandon=lambda: _refused(targets, joins),
        # The other replicas' joins end on reading why (bounded like any join).
        linger=lambda: futures_wait(joins, timeout=spec.timeout_s),
    )
    executor: DistExecutor | NaiveExecutor | None = None
    try:
        check_plan_hash(group, plan.content_hash(), params=_plan_params(plan))
        # Before waiting for the joins: a replica's join returns once its executor is built,
        # and the planner's setup is collective (shared-memory pairs meet in the store).
        executor = make_executor(
            spec.executor,
            plan,
            group,
            name,
            config.shared_memory == "auto",
            spec.delta,
            spec.check_samples,
        )
        for f in joins:
            replica_hash = f.result(timeout=spec.timeout_s)
            if replica_hash != plan.content_hash():
                raise RuntimeError("a replica computed a different transfer plan")
    except Exception:
        if executor is not None:
            executor.close()
        group.abort()
        raise
    log.info(
        "weight-sync group %s: %d learner ranks -> %d replicas, plan %s",
        name,
        world_size,
        len(targets),
        plan.content_hash()[:12],
    )
    return FormedGroup(group, executor, wire_dtype)


class JoinedGroup(NamedTuple):
    """A weight-sync group as one destination rank (a replica's TP rank) holds it."""

    group: WeightSyncGroup
    executor: DistExecutor | NaiveExecutor
    plan: TransferPlan
    tp_size: int
    """The TP size of this rank's replica."""


def join_group(
    spec: GroupSpec,
    replica_index: int,
    table: ParamTable,
    device: torch.device,
    tp_rank: int,
    sliced: Topology | None,
    whole: bool,
) -> JoinedGroup:
    """The replica side: TP rank ``tp_rank`` of replica ``replica_index`` (holding
    ``table``'s parameters on ``device``) joins the group ``spec`` names, with the plan the
    learner computed (``sliced``, ``whole``: as in ``weight_sync_topology``)."""
    topology = weight_sync_topology(table, spec.replica_tp_sizes, sliced, whole)
    check_same_params(
        {p.name: p.shape for p in topology.params},
        {name: tuple(shape) for name, shape, _ in table},
        "this replica",
        "never be received",
    )
    plan = make_plan(topology, spec.num_src_ranks, list(spec.replica_tp_sizes), spec.bucket_bytes)
    tp_size = int(spec.replica_tp_sizes[replica_index])
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp rank {tp_rank} outside replica TP size {tp_size}")
    group = init_weight_sync_group(
        spec.store_host,
        spec.store_port,
        plan.world_size,
        plan.group_rank(replica_index, tp_rank),
        spec.backend,
        spec.timeout_s,
        group_name=spec.group_name,
        is_store_host=False,
        device=device if spec.backend == "nccl" else None,
        local_addr=route_address(spec.store_host, spec.store_port),
    )
    try:
        check_plan_hash(group, plan.content_hash(), params=_plan_params(plan))
        executor = make_executor(
            spec.executor,
            plan,
            group,
            spec.group_name,
            delta=spec.delta,
            check_samples=spec.check_samples,
        )
    except Exception:
        group.abort()
        raise
    return JoinedGroup(group, executor, plan, tp_size)


def _plan_params(plan: TransferPlan) -> dict[str, tuple[int, ...]]:
    """The plan's parameter names and shapes (published beside its hash)."""
    return {p.name: p.shape for p in plan.topology.params}


def _describe(
    targets: Sequence[str], describe: DescribeFn | None, module: nn.Module, whole: bool
) -> tuple[list[int], str, str]:
    """(every target's TP size, the dtype they hold weights in ("" unknown), why a target
    is refused or ""): each replica's reported layout must be the one this learner's model
    gives for the family it names, and all must hold one dtype (one plan sends one)."""
    if describe is None:
        return [1] * len(targets), "", ""
    tp_sizes, dtypes = [], {}
    for target in targets:
        try:
            reported = describe(target)
            expected = _expected_layout(module, whole, reported.layout.family)
            check_same_layout(expected, reported.layout, target)
        except Exception as exc:  # noqa: BLE001 — every rank raises it after the broadcast
            return [], "", str(exc) if isinstance(exc, ValueError) else _one_line(exc)
        tp_sizes.append(int(reported.tp_size))
        if reported.layout.dtype:
            dtypes[target] = reported.layout.dtype
    if len(set(dtypes.values())) > 1:
        return (
            [],
            "",
            (
                f"replicas hold their weights in different dtypes ({dtypes}); one weight-sync "
                "group sends one dtype: give every replica the same rollout.dtype"
            ),
        )
    return tp_sizes, next(iter(dtypes.values()), ""), ""


def _expected_layout(module: nn.Module, whole: bool, family_name: str) -> ReplicaLayout:
    """The layout the learner's ``module`` has in ``family_name`` ("" whole tensors): the
    registry entry of the learner's own config, which must be that family."""
    if not family_name:
        return layout_of("", replicated_topology(param_table(module)))
    if whole:
        raise ValueError(
            f"a replica takes the whole {family_name!r} model, but this learner publishes "
            "LoRA adapters (learner.lora): start the rollout from the same job config"
        )
    from hybridflow.models.families import family_of_config

    config = getattr(module, "config", None)
    try:
        family = family_of_config(config)
    except ValueError as exc:
        raise ValueError(f"a replica holds family {family_name!r}; the learner's {exc}") from exc
    dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
    return layout_of(family.model_type, family.sliced_topology(family.dims(config, dtype)))


def _sliced_topology(module: nn.Module, tp_sizes: Sequence[int], dtype: str) -> Topology | None:
    """The model family's sliced topology for tensor-parallel replicas (the registry
    refuses a family it does not know); None when every replica is TP 1."""
    if all(int(t) == 1 for t in tp_sizes):
        return None
    from hybridflow.models.families import family_of_config

    config = getattr(module, "config", None)
    family = family_of_config(config)
    return family.sliced_topology(family.dims(config, dtype))


def _refused(targets: Sequence[str], joins: Sequence[Future[str]]) -> str | None:
    """Why the group cannot form: the first replica whose join call failed, else None."""
    for target, join in zip(targets, joins):
        exc = join.exception() if join.done() else None
        if exc is not None:
            return f"replica {target} refused to join: {_one_line(exc)}"
    return None


def _one_line(exc: BaseException) -> str:
    """An RPC error as its status and details (duck-typed: no gRPC import here), else the
    class and the first line of the message."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{getattr(code(), 'name', code())}: {details()}"
    return f"{type(exc).__name__}: {exc}".splitlines()[0]
