"""The learner side of weight sync over a torch.distributed group: ``DistPublisher``, on
every learner rank, sends that rank's FSDP dim-0 shards to the rollout replicas.

The group is separate from the learner's FSDP group (gloo on CPU, NCCL on GPU, same code);
forming it, both ends, is ``dist_formation``'s, the replica side ``dist_receiver``'s. Each
sync replays the plan: each destination receives only its own slices (``executor:
planner``), or the naive gather-and-broadcast oracle runs instead (``executor: naive``).

Each replica has a group of its own (the learner ranks and that replica's TP ranks), formed
the first time a publish names it: a replica that joins a running job, or comes back after a
failure, forms only its own group and the others are not touched; a full publish names the
whole serving set, and ``retire`` closes the groups of the replicas it no longer names. On
gloo the groups send at once (one thread each), on NCCL one after the other.

Every send takes one path: ``_start`` forms the missing groups and takes this rank's shards,
and the learner ranks agree at once on how that went; ``_send`` sends them and (rank 0) waits
for every replica's receive call; ``_settle`` waits for the send and the ranks agree whether
it succeeded everywhere. ``publish`` settles at once (one rebuild-and-retry) and raises on
every rank if it failed; ``start`` leaves the send running (on gloo, a background thread),
``finish`` reports it and raises if it failed, and the next publish settles it. A failure
aborts, on every learner rank (agreed through an all-reduce on their own group), the groups of
the replicas it concerns (all of them when it is not one replica's: a shard that could not be
read), and the next attempt forms those again under a new name and port. Waits on the
replicas and on the send are bounded by ``weight_sync.timeout_s``.

This module knows nothing of gRPC: replicas are reached through ``ReplicaWeightClient``s
(``hybridflow.weights.client`` over gRPC) from rank 0, or through ``publish_with``'s
``join`` / ``receive`` / ``describe`` callables.

Its length (about 550 lines) is one state machine, ``DistPublisher``'s start, send and settle,
with the per-replica groups they act on; forming a group is already ``dist_formation``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.errors import DeliveryFailed
from hybridflow.types import WeightUpdateReport
from hybridflow.weights.base import ReplicaWeightClient
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.dist_formation import (
    DescribeFn,
    JoinFn,
    form_group,
    group_backend,
)
from hybridflow.weights.transport.executors import DistExecutor, NaiveExecutor
from hybridflow.weights.transport.group import WeightSyncGroup

log = logging.getLogger(__name__)

ReceiveFn = Callable[[str, int], int]
"""receive(target, policy_version) -> bytes the replica received (blocks until done)."""


DELTA_GAINS_NOTHING = 0.5
"""Share of changed elements above which a delta sync is warned about (``_warn_delta``)."""


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
    _lanes: dict[str, _Lane] = field(default_factory=dict)
    """One weight-sync group per replica, by its address: a replica that joins or comes
    back forms its own, and the others' are left as they are."""
    _generation: int = 0
    """Groups formed so far (numbers their names)."""
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8, "weight-sync"))
    _lane_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(8, "weight-sync-lane")
    )
    """Runs the groups' sends at once (gloo)."""
    _sender: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, "weight-sync-send")
    )
    """Runs the one background send ``start`` began (at most one is in flight)."""
    _inflight: _Send | None = None
    """That send, until the next publish settles it on every learner rank."""
    _reported: _Send | None = None
    """That send, until ``finish`` reports it."""
    _snapshots: dict[str, torch.Tensor] = field(default_factory=dict)
    """The background send's copies of the shards, allocated once and refilled at every
    ``start`` (see ``_snapshot``)."""
    _snapshot_reader: Future[WeightUpdateReport] | None = None
    """The send that last read ``_snapshots``: refilled only once it has ended."""
    _delta_warned: bool = False
    """Whether the warning that delta syncs gain nothing here was given (once a job)."""

    @property
    def backend(self) -> str:
        return group_backend(self.config, self.device)

    @property
    def in_background(self) -> bool:
        """Whether ``start`` leaves the send to a background thread: on gloo (CPU). NCCL
        sends inline: NCCL kernels of two communicators (this group's and FSDP's) issued from
        two threads in different orders on different ranks may wait on each other."""
        return self.backend == "gloo"

    def publish(self, targets: Sequence[str], version: int) -> WeightUpdateReport:
        """Sends the current weights to every target (the WeightPublisher interface)."""
        self._settle_previous()
        return self.publish_with(targets, version, *self._reach())

    def publish_with(
        self,
        targets: Sequence[str],
        version: int,
        join: JoinFn | None,
        receive: ReceiveFn | None,
        describe: DescribeFn | None = None,
    ) -> WeightUpdateReport:
        """Sends the current weights to every target and settles the send at once; one
        rebuild-and-retry on failure. ``join``, ``receive`` and ``describe`` reach the
        replicas (rank 0 only; ``describe`` None: every replica is TP 1 and takes whole
        tensors, unchecked)."""
        start = time.perf_counter()
        for attempt in (1, 2):
            try:
                sent = self._start(tuple(targets), version, join, receive, describe, False)
                report, failure = self._settle(sent)
                if failure:
                    undelivered = _delivery_failure(sent)
                    if undelivered is not None:
                        raise undelivered
                    raise RuntimeError(f"weight sync to {list(targets)} failed: {failure}")
                assert report is not None
                return WeightUpdateReport(version, report.num_bytes, time.perf_counter() - start)
            except DeliveryFailed:
                raise  # a replica got other bytes than were sent: never retried, the run stops
            except Exception as exc:
                if attempt == 2:
                    raise
                log.warning("weight sync failed (%s); rebuilding the group and retrying", exc)
        raise AssertionError("unreachable")

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
        self._settle_previous()
        sent = self._start(tuple(targets), version, join, receive, describe, self.in_background)
        self._inflight = self._reported = sent

    def finish(self) -> WeightUpdateReport:
        """Waits for the send ``start`` began (bounded by ``timeout_s``) and reports it; on
        rank 0 it returns only once every target received its weights. Raises if the send
        failed (the group is rebuilt at the next publish). Runs beside train steps."""
        reported, self._reported = self._reported, None
        if reported is None:
            raise RuntimeError("no publish in flight: call start first")
        try:
            return reported.future.result(timeout=self.config.timeout_s)
        except FutureTimeout as exc:
            raise TimeoutError("weight sync did not finish within weight_sync.timeout_s") from exc

    def retire(self, keep: Sequence[str]) -> None:
        """Closes the groups of the replicas not in ``keep`` (every learner rank together,
        in a relayed command): a full publish names the whole serving set, so a replica that
        was drained, removed or has failed since loses its group here, and rebuilds one if
        it comes back. The send in flight is settled first (it may use one of them)."""
        self._settle_previous()
        for target in [t for t in self._lanes if t not in set(keep)]:
            self._drop(target, graceful=True)

    def _start(
        self,
        targets: tuple[str, ...],
        version: int,
        join: JoinFn | None,
        receive: ReceiveFn | None,
        describe: DescribeFn | None,
        background: bool,
    ) -> _Send:
        """Every send, on every learner rank together. First, agreed at once: a group is
        formed for each target that has none (the others' groups are left as they are) and
        this rank's shards are taken (a snapshot when ``background``: the next optimizer step
        changes the parameters in place); a failure on any rank aborts the groups it
        concerns (all of them when it is not one replica's) and raises on every rank. Then
        ``_send`` runs, on the sender thread when ``background``, else here; its outcome is
        the returned send, which ``_settle`` agrees on."""
        start = time.perf_counter()
        error, shards, failed = "", {}, {}
        try:
            failed = self._open_lanes(targets, join, describe)
            shards = self._snapshot() if background else self._local()
        except Exception as exc:  # noqa: BLE001 — agreed on below, then raised
            error = _failure(exc)
        failure = self._agreed(targets, error, set(failed))
        if failure:
            why = "; ".join(f"replica {t}: {e}" for t, e in failed.items()) or failure
            raise RuntimeError(f"weight sync to {list(targets)} failed: {why}")
        if background:
            queued = self._sender.submit(self._send, targets, version, shards, receive, start)
            self._snapshot_reader = queued
            return _Send(queued, targets)
        sent: Future[WeightUpdateReport] = Future()
        try:
            sent.set_result(self._send(targets, version, shards, receive, start))
        except Exception as exc:  # noqa: BLE001 — settled like a background one
            sent.set_exception(exc)
        return _Send(sent, targets)

    def _send(
        self,
        targets: tuple[str, ...],
        version: int,
        shards: dict[str, torch.Tensor],
        receive: ReceiveFn | None,
        start: float,
    ) -> WeightUpdateReport:
        """The shards along each target's plan, then (rank 0) every target's receive call,
        which must all end within ``timeout_s`` of the shards' send; raises on any failure,
        naming the replicas it concerns (``failed_targets``), after the others are served."""
        futures: dict[str, Future[int]] = {}
        if self.rank == 0:
            assert receive is not None
            futures = {t: self._pool.submit(receive, t, version) for t in targets}
        failures = self._sync_lanes(targets, shards)
        deadline = time.monotonic() + self.config.timeout_s
        received = []
        for target, future in futures.items():
            if target in failures:
                continue  # its send failed: its receive cannot end well, and is not waited for
            try:
                received.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                failures[target] = TimeoutError(
                    f"replica {target} did not receive weights v{version} within "
                    "weight_sync.timeout_s"
                )
            except DeliveryFailed as exc:  # its check found a slice other than was sent
                failures[target] = DeliveryFailed(
                    f"weights v{version} did not reach replica {target} intact; it stays "
                    f"on its previous weights: {exc}"
                )
            except Exception as exc:  # noqa: BLE001 — raised below, with the others
                failures[target] = exc
        self._log_deltas(version, targets)
        if failures:
            raise _lanes_failed(targets, failures)
        return WeightUpdateReport(version, max(received, default=0), time.perf_counter() - start)

    def _sync_lanes(
        self, targets: tuple[str, ...], shards: dict[str, torch.Tensor]
    ) -> dict[str, BaseException]:
        """Runs each target's executor over the same shards; the failures by target. On
        gloo the groups send at once, one thread each (they share nothing but the shards,
        which they only read); NCCL groups one after the other (``in_background``)."""
        lanes = [(t, self._lanes[t]) for t in targets]
        if self.in_background and len(lanes) > 1:
            running = {t: self._lane_pool.submit(lane.executor.sync, shards) for t, lane in lanes}
            futures_wait(running.values())
            return {t: e for t, f in running.items() if (e := f.exception()) is not None}
        failures: dict[str, BaseException] = {}
        for target, lane in lanes:
            try:
                lane.executor.sync(shards)
            except Exception as exc:  # noqa: BLE001 — the other replicas are still served
                failures[target] = exc
        return failures

    def _log_deltas(self, version: int, targets: tuple[str, ...]) -> None:
        for target in targets:
            lane = self._lanes.get(target)
            delta = getattr(lane.executor, "last_delta", None) if lane else None
            if delta is not None and delta.num_elements:
                log.info(
                    "weights v%d to %s: delta from learner rank %d: %.3f%% of %d elements "
                    "changed, %d bytes sent",
                    version,
                    target,
                    self.rank,
                    100.0 * delta.num_changed / delta.num_elements,
                    delta.num_elements,
                    delta.num_bytes,
                )
                if delta.num_changed > DELTA_GAINS_NOTHING * delta.num_elements:
                    self._warn_delta(delta.num_changed / delta.num_elements)

    def _warn_delta(self, share: float) -> None:
        if not self._delta_warned:
            self._delta_warned = True
            log.warning(
                "weight_sync.delta: %.1f%% of the elements changed since the last sync, so "
                "nearly every slice goes whole and the delta only adds its comparison and "
                "copies (an fp32 replica under Adam: every element moves every step; at the "
                "0.5B shape a delta sync took about 5x a full one, benchmarks/LOG.md). Delta pays "
                "off for bf16 replicas across hosts; weight_sync.delta: false is faster here",
                100.0 * share,
            )

    def _local(self) -> dict[str, torch.Tensor]:
        """This rank's shards as they are (cast to the wire dtype when it differs: a copy)."""
        return {n: _local(p, self._wire_dtype) for n, p in self.module.named_parameters()}

    def _snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of this rank's shards (in the wire dtype) that the next optimizer step does
        not change: what a background send reads. The copies live in buffers allocated at the
        first background send and refilled at each later one (the previous send has been
        settled by then), not allocated afresh: a fresh 2 GB (0.5B fp32) a publish, freed
        while the next train step allocates its gradients, fragmented a heap that keeps freed
        memory (``hybridflow.utils.malloc``), and made the learner's peak grow by 2-4 GB.
        Fresh buffers are taken only when a send still reads the old ones (one that timed
        out) or the shapes changed (a rebuilt group with another wire dtype)."""
        reader = self._snapshot_reader
        if reader is not None and not reader.done():
            self._snapshots = {}
        out: dict[str, torch.Tensor] = {}
        for name, param in self.module.named_parameters():
            local = _local(param)
            dtype = self._wire_dtype or local.dtype
            buffer = self._snapshots.get(name)
            if buffer is None or buffer.shape != local.shape or buffer.dtype != dtype:
                buffer = torch.empty(local.shape, dtype=dtype, device=local.device)
            buffer.copy_(local)
            out[name] = buffer
        self._snapshots = out
        return out

    def _settle(self, sent: _Send) -> tuple[WeightUpdateReport | None, str]:
        """Ends a send on every learner rank together (a collective on the learner's group,
        so it runs in a relayed command, never beside a train step): waits for it (bounded by
        ``timeout_s``), then (its report, "") if it succeeded on every rank, else (None, why),
        the groups it failed on aborted on every rank (all of them when the failure was not
        one replica's) and formed again at their next publish."""
        failed: set[str] = set()
        try:
            report, error = sent.future.result(timeout=self.config.timeout_s), ""
        except Exception as exc:  # noqa: BLE001 — agreed on below, then reported
            report, error = None, _failure(exc)
            failed = set(getattr(exc, "failed_targets", ()))
        failure = self._agreed(sent.targets, "" if failed else error, failed)
        return (None, error or failure) if failure else (report, "")

    def _settle_previous(self) -> None:
        """Settles the send ``start`` left in flight, if any. Its failure is ``finish``'s to
        raise; here it is only logged, and the groups it failed on are formed again."""
        if self._inflight is None:
            return
        inflight, self._inflight = self._inflight, None
        _, failure = self._settle(inflight)
        if failure:
            log.warning("background weight sync failed (%s); its groups are rebuilt", failure)

    def _agreed(self, targets: tuple[str, ...], error: str, failed: set[str]) -> str:
        """The learner ranks' agreement (an all-reduce on their own group) on a step every
        one of them ran: ``error`` is this rank's failure that concerns every group ("" none),
        ``failed`` the targets whose own group failed here. Returns "" when nothing failed
        anywhere, else why, once the groups concerned are aborted: those any rank named, or
        every group when a rank failed wholly."""
        flags = [1 if error else 0] + [1 if t in failed else 0 for t in targets]
        agreed = _agreed_flags(flags, self.group)
        if not any(agreed):
            return ""
        if agreed[0]:
            dropped = set(self._lanes) | set(targets)
        else:
            dropped = {t for t, flag in zip(targets, agreed[1:]) if flag}
        for target in dropped:
            self._drop(target)
        named = ", ".join(sorted(t for t in dropped if t in failed))
        return error or (f"replica {named}" if named else "on another learner rank")

    def _open_lanes(
        self, targets: tuple[str, ...], join: JoinFn | None, describe: DescribeFn | None
    ) -> dict[str, str]:
        """Forms a group for each target that has none, one after the other on every learner
        rank (each formation is collective); the others' groups are untouched. Returns why
        each one that failed here did (its group is then not kept on this rank)."""
        failed: dict[str, str] = {}
        for target in [t for t in targets if t not in self._lanes]:
            self._generation += 1
            try:
                formed = form_group(
                    (target,),
                    join,
                    describe,
                    config=self.config,
                    rank=self.rank,
                    world_size=self.world_size,
                    module=self.module,
                    device=self.device,
                    learner_group=self.group,
                    whole=self.whole,
                    generation=self._generation,
                    pool=self._pool,
                    dtype=self._lane_dtype(),
                )
            except Exception as exc:  # noqa: BLE001 — agreed on by the caller
                failed[target] = _failure(exc)
                continue
            self._lanes[target] = _Lane(*formed)
        return failed

    @property
    def _wire_dtype(self) -> torch.dtype | None:
        """The replicas' dtype when it is not the learner's (shards are cast to it); every
        group has the same (a replica holding another is refused when its group forms)."""
        return next(iter(self._lanes.values())).wire_dtype if self._lanes else None

    def _lane_dtype(self) -> str:
        """The dtype the groups send in ("" before any is formed)."""
        if not self._lanes:
            return ""
        dtype = self._wire_dtype or next(self.module.parameters()).dtype
        return str(dtype).removeprefix("torch.")

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

    def _drop(self, target: str, graceful: bool = False) -> None:
        """Ends ``target``'s group on this rank: aborted after a failure, closed when the
        replica merely left the serving set."""
        lane = self._lanes.pop(target, None)
        if lane is not None:
            lane.close() if graceful else lane.abort()

    def close(self) -> None:
        if self._inflight is not None:
            futures_wait([self._inflight.future], timeout=self.config.timeout_s)
            self._inflight = None
        for target in list(self._lanes):
            self._drop(target, graceful=True)
        self._snapshots, self._snapshot_reader = {}, None
        self._sender.shutdown(wait=False, cancel_futures=True)
        self._lane_pool.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self._clients.values():
            client.close()
        self._clients.clear()


@dataclass
class _Lane:
    """One replica's weight-sync group, as one learner rank holds it."""

    group: WeightSyncGroup
    executor: DistExecutor | NaiveExecutor
    wire_dtype: torch.dtype | None

    def abort(self) -> None:
        self.executor.close()
        self.group.abort()

    def close(self) -> None:
        self.executor.close()
        self.group.close()


class _Send(NamedTuple):
    """A send ``_start`` began: its outcome, and the replicas it went to."""

    future: Future[WeightUpdateReport]
    targets: tuple[str, ...]


def _failure(exc: BaseException) -> str:
    """A failed step as the other ranks and the caller read it: class and message."""
    return f"{type(exc).__name__}: {exc}"


def _local(p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """This rank's shard of ``p`` (in ``dtype`` when given: a copy)."""
    local = p.to_local() if hasattr(p, "to_local") else p
    return local.detach() if dtype is None else local.detach().to(dtype)


def _agreed_flags(flags: list[int], group: dist.ProcessGroup | None = None) -> list[int]:
    """Each flag summed over the source ranks (all-reduce over the learner's own
    ``group``): non-zero where any rank raised it."""
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return flags
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    tensor = torch.tensor(flags, dtype=torch.int32, device=device)
    dist.all_reduce(tensor, group=group)
    return [int(v) for v in tensor.tolist()]


def _lanes_failed(targets: tuple[str, ...], failures: dict[str, BaseException]) -> Exception:
    """One error for a send that failed on some replicas' groups, naming them
    (``failed_targets``): ``DeliveryFailed`` when a replica's check refused what arrived
    (never retried), else a ``RuntimeError``."""
    refused = [e for e in failures.values() if isinstance(e, DeliveryFailed)]
    if refused:
        error: Exception = DeliveryFailed("; ".join(str(e) for e in refused))
    else:
        why = "; ".join(f"replica {t}: {_failure(e)}" for t, e in failures.items())
        error = RuntimeError(f"weight sync to {list(targets)} failed: {why}")
    error.failed_targets = tuple(failures)  # type: ignore[attr-defined]
    return error


def _delivery_failure(sent: _Send) -> DeliveryFailed | None:
    """The ``DeliveryFailed`` a settled send raised on this rank (rank 0: a replica's check
    refused what arrived), if that is how it failed."""
    future = sent.future
    error = future.exception(timeout=0) if future.done() else None
    return error if isinstance(error, DeliveryFailed) else None
