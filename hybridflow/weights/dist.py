"""Weight sync over a torch.distributed group between learner ranks and rollout replicas.

The group is separate from the learner's FSDP group: learner rank 0 serves a TCPStore, every
learner rank and every replica's TP ranks join it (gloo on CPU, NCCL on GPU, same code). The
resharding planner computes one transfer plan per replica set; every party checks its hash
before the first sync, and each sync replays it: learner ranks send only their FSDP dim-0
shards, each destination receives only its own slices (``executor: planner``), or the naive
gather-and-broadcast oracle runs instead (``executor: naive``).

A sync that fails or times out aborts the group on every learner rank (they agree through an
all-reduce on their own group) and the next attempt rebuilds it under a new name and port.
This module knows nothing of gRPC: replicas are reached through ``ReplicaWeightClient``s
(``hybridflow.weights.client`` over gRPC) from rank 0, or through ``publish_with``'s
``join`` / ``receive`` / ``describe`` callables. Before a group forms, every replica's
reported layout is compared with the one the learner's family registry entry gives
(``resharding.layout``): a replica that places a parameter otherwise is refused, named.

The file is long because the learner side (``DistPublisher``: build, publish, the background
send of ``start``/``finish``, abort) and the replica side share the group's life cycle and
its failure agreement; splitting them would split one protocol across files. Known
near-copy: ``_publish_once`` and ``start_with`` + ``_send`` build, copy and send alike; they
differ in when the ranks agree on a failed send (at once, or at the next publish), which is
why they are not yet one path.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.resharding.coverage import check_learner_covered, check_same_params
from hybridflow.resharding.layout import ReplicaLayout, check_same_layout, layout_of
from hybridflow.resharding.plan import TransferPlan, make_plan
from hybridflow.resharding.topology import (
    DestParam,
    DestPart,
    ParamSpec,
    Placement,
    Topology,
    part_slices,
)
from hybridflow.types import WeightUpdateReport
from hybridflow.weights.base import ReplicaWeightClient
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.spec import GroupSpec, ReplicaDescription
from hybridflow.weights.transport.executors import DistExecutor, NaiveExecutor
from hybridflow.weights.transport.group import (
    WeightSyncGroup,
    check_plan_hash,
    init_weight_sync_group,
)
from hybridflow.weights.transport.reference import torch_dtype

log = logging.getLogger(__name__)

VLLM_CUTS_ITSELF = (Placement.VOCAB, Placement.EXPERT_COLUMN, Placement.EXPERT_ROW)
"""Placements whose vLLM loaders take the whole tensor and cut each rank's part themselves
(vocabulary-parallel tables, FusedMoE's experts): a rank's slice goes in at full size."""


DescribeFn = Callable[[str], ReplicaDescription]
"""describe(target) -> that replica's TP size (each TP rank joins as a destination) and its
weight layout (family and placements, computed from the model it loaded)."""
JoinFn = Callable[[str, GroupSpec, int], str]
"""join(target, spec, replica_index) -> the replica's plan hash (blocks until formed)."""
ReceiveFn = Callable[[str, int], int]
"""receive(target, policy_version) -> bytes the replica received (blocks until done)."""


def param_table(module: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, global shape, dtype) of every parameter, tied ones once, sorted by name."""
    return sorted(
        (name, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for name, p in module.named_parameters()
    )


def replicated_topology(table: Sequence[tuple[str, tuple[int, ...], str]]) -> Topology:
    """Destinations that hold whole tensors (TP 1: the HF engine)."""
    return Topology(
        params=tuple(ParamSpec(n, shape, dtype) for n, shape, dtype in table),
        dests=tuple(DestParam(n, (DestPart(n, Placement.REPLICATED),)) for n, _, _ in table),
    )


def weight_sync_topology(
    table: Sequence[tuple[str, tuple[int, ...], str]],
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
) -> DistExecutor | NaiveExecutor:
    """The executor every rank of the group builds (the planner's setup is collective).
    ``shared_memory``: this rank offers shared memory to its same-host peers; a pair uses it
    only when both offer (a learner with ``weight_sync.shared_memory: off`` offers nothing)."""
    if kind == "planner":
        return DistExecutor(plan, group, shared_memory=shared_memory, group_name=group_name)
    if kind == "naive":
        return NaiveExecutor(plan, group)
    raise ValueError(f"weight_sync.executor must be planner or naive, got {kind!r}")


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


class DistReceiver:
    """Rollout side, one per destination rank (a replica's TP rank): joins groups and
    receives that rank's part of the weights (whole tensors at TP 1): into fresh tensors over
    sockets, or, from learner ranks on this host, into a shared staging buffer whose tensors
    stay valid while referenced (``weights.transport.same_host``)."""

    def __init__(
        self,
        table: Sequence[tuple[str, tuple[int, ...], str]],
        device: torch.device,
        tp_rank: int = 0,
        sliced: Topology | None = None,
        whole: bool = False,
    ) -> None:
        """``whole``: every TP rank receives whole tensors (a LoRA adapter's), not slices."""
        self._whole = whole
        self._table = list(table)
        self._device = device
        self._tp_rank = tp_rank
        self._sliced = sliced
        self._group: WeightSyncGroup | None = None
        self._executor: DistExecutor | NaiveExecutor | None = None
        self.plan: TransferPlan | None = None
        self.tp_size = 1

    def join(self, spec: GroupSpec, replica_index: int) -> str:
        self.close()
        topology = weight_sync_topology(
            self._table, spec.replica_tp_sizes, self._sliced, self._whole
        )
        check_same_params(
            {p.name: p.shape for p in topology.params},
            {name: tuple(shape) for name, shape, _ in self._table},
            "this replica",
            "never be received",
        )
        plan = make_plan(
            topology, spec.num_src_ranks, list(spec.replica_tp_sizes), spec.bucket_bytes
        )
        self.tp_size = int(spec.replica_tp_sizes[replica_index])
        if not 0 <= self._tp_rank < self.tp_size:
            raise ValueError(f"tp rank {self._tp_rank} outside replica TP size {self.tp_size}")
        group = init_weight_sync_group(
            spec.store_host,
            spec.store_port,
            plan.world_size,
            plan.group_rank(replica_index, self._tp_rank),
            spec.backend,
            spec.timeout_s,
            group_name=spec.group_name,
            is_store_host=False,
            device=self._device if spec.backend == "nccl" else None,
            local_addr=route_address(spec.store_host, spec.store_port),
        )
        try:
            check_plan_hash(group, plan.content_hash(), params=_plan_params(plan))
        except Exception:
            group.abort()
            raise
        self._group, self.plan = group, plan
        try:
            self._executor = make_executor(spec.executor, plan, group, spec.group_name)
        except Exception:
            self.close(abort=True)
            raise
        return plan.content_hash()

    def in_full_size(self, name: str, local: torch.Tensor) -> torch.Tensor | None:
        """This rank's slice of a tensor whose vLLM loader cuts the rank's part out of the
        whole itself (vocabulary-parallel tables, FusedMoE experts), placed where that loader
        reads it in an uninitialised full-size tensor (the rest is never touched); None for
        any other tensor."""
        if self.plan is None:
            return None
        topology = self.plan.topology
        dest = next((d for d in topology.dests if d.name == name), None)
        if dest is None or dest.parts[0].placement not in VLLM_CUTS_ITSELF:
            return None
        full = torch.empty(topology.param(dest.parts[0].source).shape, dtype=local.dtype)
        for i in range(len(dest.parts)):
            src, dst = part_slices(topology, dest, i, self.tp_size, self._tp_rank)
            full[src].copy_(local[dst])
        return full

    def receive(self) -> tuple[list[tuple[str, torch.Tensor]], int]:
        if self._executor is None or self._group is None:
            raise ValueError("no weight-sync group: call JoinWeightSync first")
        try:
            result = self._executor.sync(None)
        except Exception:
            self.close(abort=True)
            raise
        return list(result.tensors.items()), result.stats.num_bytes_received

    def close(self, abort: bool = False) -> None:
        if self._executor is not None:
            self._executor.close()
        if self._group is not None:
            self._group.abort() if abort else self._group.close()
        self._group, self._executor = None, None


@dataclass
class DistPublisher:
    """Learner side, on every learner rank: builds the group when the replica set changes,
    then sends its local FSDP shards along the plan at each publish."""

    config: WeightSyncConfig
    rank: int
    world_size: int
    module: nn.Module
    device: torch.device
    client_factory: Callable[[str], ReplicaWeightClient] | None = None
    """Rank 0: reaches each replica's WeightSyncService (join, receive, TP size)."""
    group: dist.ProcessGroup | None = None
    """The learner ranks that hold the actor (the sources), when not the whole default group
    (a learner with its critic on ranks of its own); they must include global rank 0."""
    whole: bool = False
    """Every replica TP rank takes whole tensors (``module`` holds LoRA adapters)."""
    _clients: dict[str, ReplicaWeightClient] = field(default_factory=dict)
    _group: WeightSyncGroup | None = None
    _executor: DistExecutor | NaiveExecutor | None = None
    _targets: tuple[str, ...] = ()
    _generation: int = 0
    _wire_dtype: torch.dtype | None = None
    """The replicas' dtype when it is not the learner's (shards are cast to it)."""
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8, "weight-sync"))
    _sender: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, "weight-sync-send")
    )
    """Runs the one background send ``start`` began (at most one is in flight)."""
    _inflight: Future[WeightUpdateReport] | None = None
    """That send, until the next publish settles it on every learner rank."""
    _reported: Future[WeightUpdateReport] | None = None
    """That send, until ``finish`` reports it."""

    @property
    def backend(self) -> str:
        if self.config.backend != "auto":
            return self.config.backend
        return "nccl" if self.device.type == "cuda" else "gloo"

    def publish(self, targets: Sequence[str], version: int) -> WeightUpdateReport:
        """Sends the current weights to every target (the WeightPublisher interface)."""
        self._settle()
        return self.publish_with(targets, version, *self._reach())

    def start(self, targets: Sequence[str], version: int) -> None:
        """Begins a publish and returns once it no longer reads the parameters: the previous
        background send is settled (every learner rank agrees how it ended; a failed one
        aborts the group), the group is (re)built if the targets changed, this rank's shards
        are copied, and their send, with rank 0's receive calls, runs on a background thread
        over the weight-sync group only: never the learner's own group, so it may run beside
        the next train step's collectives. ``finish`` reports it (rank 0). On NCCL the send
        runs inline instead (``in_background``)."""
        self.start_with(targets, version, *self._reach())

    def start_with(
        self,
        targets: Sequence[str],
        version: int,
        join: JoinFn | None,
        receive: ReceiveFn | None,
        describe: DescribeFn | None = None,
    ) -> None:
        """``start`` reaching the replicas through ``join``, ``receive`` and ``describe``
        (rank 0 only; as in ``publish_with``)."""
        self._settle()
        start = time.perf_counter()
        ok, error = True, ""
        shards: dict[str, torch.Tensor] = {}
        try:
            if self._group is None or tuple(targets) != self._targets:
                self._build(tuple(targets), join, describe)
            copy = _snapshot if self.in_background else _local
            shards = {n: copy(p, self._wire_dtype) for n, p in self.module.named_parameters()}
        except Exception as exc:  # noqa: BLE001 — agreed on below, then raised
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if not _all_ok(ok, self.group):
            self._abort()
            raise RuntimeError(
                f"weight sync to {list(targets)} failed: {error or 'on another learner rank'}"
            )
        if self.in_background:
            self._inflight = self._reported = self._sender.submit(
                self._send, tuple(targets), version, shards, receive, start
            )
            return
        done: Future[WeightUpdateReport] = Future()
        try:
            done.set_result(self._send(tuple(targets), version, shards, receive, start))
        except Exception as exc:  # noqa: BLE001 — settled and reported like a background one
            done.set_exception(exc)
        self._inflight = self._reported = done

    @property
    def in_background(self) -> bool:
        """Whether ``start`` leaves the send to a background thread: on gloo (CPU). NCCL
        sends inline: NCCL kernels of two communicators (this group's and FSDP's) issued from
        two threads in different orders on different ranks may wait on each other."""
        return self.backend == "gloo"

    def finish(self) -> WeightUpdateReport:
        """Waits for the send ``start`` began (bounded by ``timeout_s``) and reports it; on
        rank 0 it returns only once every target received its weights. Raises if the send
        failed (the group is rebuilt at the next publish). Runs beside train steps."""
        reported, self._reported = self._reported, None
        if reported is None:
            raise RuntimeError("no publish in flight: call start first")
        try:
            return reported.result(timeout=self.config.timeout_s)
        except FutureTimeout as exc:
            raise TimeoutError("weight sync did not finish within weight_sync.timeout_s") from exc

    def _send(
        self,
        targets: tuple[str, ...],
        version: int,
        shards: dict[str, torch.Tensor],
        receive: ReceiveFn | None,
        start: float,
    ) -> WeightUpdateReport:
        """The background half of ``start``: the shards along the plan, then (rank 0) every
        target's receive call."""
        assert self._executor is not None
        futures: list[Future[int]] = []
        if self.rank == 0:
            assert receive is not None
            futures = [self._pool.submit(receive, t, version) for t in targets]
        try:
            self._executor.sync(shards)
            deadline = time.monotonic() + self.config.timeout_s
            received = [f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures]
        except FutureTimeout as exc:
            raise TimeoutError(f"weight sync to {list(targets)} timed out") from exc
        return WeightUpdateReport(version, max(received, default=0), time.perf_counter() - start)

    def _settle(self) -> None:
        """Ends the background send in flight, if any, on every learner rank together (a
        collective on the learner's group, so it runs in the relayed command, never beside
        a train step): if it failed anywhere, the group is aborted and rebuilt next time."""
        if self._inflight is None:
            return
        inflight, self._inflight = self._inflight, None
        try:
            inflight.result(timeout=self.config.timeout_s)
            ok = True
        except (Exception, FutureTimeout) as exc:  # noqa: BLE001 — reported by finish
            log.warning("background weight sync failed (%s); the group is rebuilt", exc)
            ok = False
        if not _all_ok(ok, self.group):
            self._abort()

    def _reach(self) -> tuple[JoinFn | None, ReceiveFn | None, DescribeFn | None]:
        """How rank 0 reaches the replicas (join, receive, describe); None on other ranks."""
        if self.rank != 0:
            return None, None, None
        timeout_s = self.config.timeout_s
        return (
            lambda t, spec, i: self._client(t).join_weight_sync(spec, i),
            lambda t, v: self._client(t).receive_weights(v, timeout_s),
            lambda t: self._client(t).describe(),
        )

    def _client(self, target: str) -> ReplicaWeightClient:
        if target not in self._clients:
            if self.client_factory is None:
                raise ValueError(f"no way to reach replica {target!r} for a weight sync")
            self._clients[target] = self.client_factory(target)
        return self._clients[target]

    def publish_with(
        self,
        targets: Sequence[str],
        version: int,
        join: JoinFn | None,
        receive: ReceiveFn | None,
        describe: DescribeFn | None = None,
    ) -> WeightUpdateReport:
        """Sends the current weights to every target; one rebuild-and-retry on failure.
        ``join``, ``receive`` and ``describe`` reach the replicas (rank 0 only; ``describe``
        None: every replica is TP 1 and takes whole tensors, unchecked)."""
        start = time.perf_counter()
        for attempt in (1, 2):
            try:
                num_bytes = self._publish_once(tuple(targets), version, join, receive, describe)
                return WeightUpdateReport(version, num_bytes, time.perf_counter() - start)
            except Exception as exc:
                if attempt == 2:
                    raise
                log.warning("weight sync failed (%s); rebuilding the group and retrying", exc)
        raise AssertionError("unreachable")

    def _publish_once(
        self,
        targets: tuple[str, ...],
        version: int,
        join: JoinFn | None,
        receive: ReceiveFn | None,
        describe: DescribeFn | None,
    ) -> int:
        ok, num_bytes, error = True, 0, ""
        try:
            if self._group is None or targets != self._targets:
                self._build(targets, join, describe)
            assert self._executor is not None
            futures: list[Future[int]] = []
            if self.rank == 0:
                assert receive is not None
                futures = [self._pool.submit(receive, t, version) for t in targets]
            shards = {n: _local(p, self._wire_dtype) for n, p in self.module.named_parameters()}
            self._executor.sync(shards)
            deadline = time.monotonic() + self.config.timeout_s
            received = [f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures]
            num_bytes = max(received, default=0)
        except (Exception, FutureTimeout) as exc:  # noqa: BLE001 — agreed on below, then raised
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if not _all_ok(ok, self.group):
            self._abort()
            raise RuntimeError(
                f"weight sync to {list(targets)} failed: {error or 'on another learner rank'}"
            )
        return num_bytes

    def _build(
        self, targets: tuple[str, ...], join: JoinFn | None, describe: DescribeFn | None
    ) -> None:
        self._abort()
        self._generation += 1
        tp_sizes_0, dtype_0, refusal = (
            self._describe(targets, describe) if self.rank == 0 else ([], "", "")
        )
        store_socket = None
        if self.rank == 0 and not refusal:
            store_socket = listen_socket(self.config.store_host)
        meeting: list[Any] = [
            store_socket.getsockname()[1] if store_socket is not None else 0,
            f"ws{self._generation}-{uuid.uuid4().hex[:8]}",
            tp_sizes_0,
            refusal,
            dtype_0,
        ]
        if dist.is_initialized() and self.world_size > 1:
            # Learner ranks agree on rank 0's meeting point and replicas over their own group.
            dist.broadcast_object_list(meeting, src=0, group=self.group)
        if meeting[3]:  # every learner rank refuses, before any replica is asked to join
            raise ValueError(str(meeting[3]))
        port, name, tp_sizes = int(meeting[0]), str(meeting[1]), tuple(meeting[2])
        # Sent in the replicas' dtype: a bf16 replica of an fp32 learner gets bf16 (half the
        # bytes), cast from the learner's shards just before each sync.
        own = param_table(self.module)
        wire = str(meeting[4]) or own[0][2]
        table = [(n, shape, wire) for n, shape, _ in own]
        self._wire_dtype = None if wire == own[0][2] else torch_dtype(wire)
        sliced = None if self.whole else self._sliced_topology(tp_sizes, wire)
        topology = weight_sync_topology(table, tp_sizes, sliced, self.whole)
        check_learner_covered(topology, table)
        plan = make_plan(topology, self.world_size, list(tp_sizes), self.config.bucket_bytes)
        spec = GroupSpec(
            self.config.store_host,
            port,
            name,
            self.backend,
            self.world_size,
            tp_sizes,
            self.config.bucket_bytes,
            self.config.executor,
            self.config.timeout_s,
        )
        joins: list[Future[str]] = []
        if self.rank == 0:
            assert join is not None
            joins = [self._pool.submit(join, t, spec, i) for i, t in enumerate(targets)]
        group = init_weight_sync_group(
            spec.store_host,
            port,
            plan.world_size,
            self.rank,
            spec.backend,
            spec.timeout_s,
            group_name=name,
            is_store_host=self.rank == 0,
            device=self.device if spec.backend == "nccl" else None,
            local_addr=route_address(spec.store_host, port),
            # The store takes ownership of the listening socket (and closes it with the group).
            listen_fd=store_socket.detach() if store_socket is not None else None,
            abandon=lambda: _refused(targets, joins),
            # The other replicas' joins end on reading why (bounded like any join).
            linger=lambda: futures_wait(joins, timeout=spec.timeout_s),
        )
        self._group = group
        check_plan_hash(group, plan.content_hash(), params=_plan_params(plan))
        # Before waiting for the joins: a replica's join returns once its executor is built,
        # and the planner's setup is collective (shared-memory pairs meet in the store).
        self._executor = make_executor(
            spec.executor, plan, group, name, self.config.shared_memory == "auto"
        )
        for f in joins:
            replica_hash = f.result(timeout=spec.timeout_s)
            if replica_hash != plan.content_hash():
                raise RuntimeError("a replica computed a different transfer plan")
        self._targets = targets
        log.info(
            "weight-sync group %s: %d learner ranks -> %d replicas, plan %s",
            name,
            self.world_size,
            len(targets),
            plan.content_hash()[:12],
        )

    def _describe(
        self, targets: Sequence[str], describe: DescribeFn | None
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
                check_same_layout(self._expected_layout(reported.layout.family), reported.layout,
                                  target)  # fmt: skip
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

    def _expected_layout(self, family_name: str) -> ReplicaLayout:
        """The layout this learner's model has in ``family_name`` ("" whole tensors): the
        registry entry of the learner's own config, which must be that family."""
        if not family_name:
            return layout_of("", replicated_topology(param_table(self.module)))
        if self.whole:
            raise ValueError(
                f"a replica takes the whole {family_name!r} model, but this learner publishes "
                "LoRA adapters (learner.lora): start the rollout from the same job config"
            )
        from hybridflow.models.families import family_of_config

        config = getattr(self.module, "config", None)
        try:
            family = family_of_config(config)
        except ValueError as exc:
            raise ValueError(
                f"a replica holds family {family_name!r}; the learner's {exc}"
            ) from exc
        dtype = str(next(self.module.parameters()).dtype).removeprefix("torch.")
        return layout_of(family.model_type, family.sliced_topology(family.dims(config, dtype)))

    def _sliced_topology(self, tp_sizes: Sequence[int], dtype: str) -> Topology | None:
        """The model family's sliced topology for tensor-parallel replicas (the registry
        refuses a family it does not know); None when every replica is TP 1."""
        if all(int(t) == 1 for t in tp_sizes):
            return None
        from hybridflow.models.families import family_of_config

        config = getattr(self.module, "config", None)
        family = family_of_config(config)
        return family.sliced_topology(family.dims(config, dtype))

    def _abort(self) -> None:
        if self._executor is not None:
            self._executor.close()
        if self._group is not None:
            self._group.abort()
        self._group, self._executor, self._targets = None, None, ()

    def close(self) -> None:
        if self._inflight is not None:
            futures_wait([self._inflight], timeout=self.config.timeout_s)
            self._inflight = None
        if self._executor is not None:
            self._executor.close()
        if self._group is not None:
            self._group.close()
        self._group, self._executor, self._targets = None, None, ()
        self._sender.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self._clients.values():
            client.close()
        self._clients.clear()


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


def _plan_params(plan: TransferPlan) -> dict[str, tuple[int, ...]]:
    """The plan's parameter names and shapes (published beside its hash)."""
    return {p.name: p.shape for p in plan.topology.params}


def _local(p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """This rank's shard of ``p`` (in ``dtype`` when given: a copy)."""
    local = p.to_local() if hasattr(p, "to_local") else p
    return local.detach() if dtype is None else local.detach().to(dtype)


def _snapshot(p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A copy of this rank's shard of ``p`` (in ``dtype`` when given) that the next optimizer
    step does not change: what a background send reads."""
    local = p.to_local() if hasattr(p, "to_local") else p
    return local.detach().to(dtype=dtype or local.dtype, copy=True)


def _all_ok(ok: bool, group: dist.ProcessGroup | None = None) -> bool:
    """Whether every source rank succeeded (all-reduce over the learner's own ``group``)."""
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return ok
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, group=group)
    return int(flag.item()) == 0


def route_address(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (what gloo binds and advertises to
    the group's other ranks). Resolving the host name instead can give an address the other
    hosts cannot reach (127.0.1.1 in /etc/hosts, another interface); the route to the store
    every rank already reaches is the one they share. Sends nothing (a UDP connect)."""
    import socket

    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host.strip("[]"), port or 9))
        return str(probe.getsockname()[0])
