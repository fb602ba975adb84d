"""gRPC face of the learner (rank 0 only): proto → domain → relayed command → proto.

``dispatch(command, args)`` runs the command on every rank (via the relay when the world is
larger than one); a lock keeps relayed commands in one order on all ranks.

What a caller may make the learner do is bounded here, before the lock is taken:
SaveCheckpoint writes only under ``checkpoint_root`` (a relative, new name), PublishWeights
reaches only ``host:port`` targets on ``weight_sync.allowed_hosts`` that answer a Describe
probe within ``weight_sync.connect_timeout_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from hybridflow.errors import FailedPrecondition, Unavailable
from hybridflow.rpc.codec import (
    check_token_range,
    pack_float_seqs,
    receive_message,
    unpack_tokens,
)
from hybridflow.rpc.config import ChannelConfig
from hybridflow.rpc.errors import handle_errors
from hybridflow.services.learner import convert
from hybridflow.services.learner.checkpoint_paths import resolve_checkpoint_target
from hybridflow.types import WeightUpdateReport
from hybridflow.v1 import common_pb2, learner_pb2, learner_pb2_grpc
from hybridflow.weights.client import check_targets, probe_replica
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.convert import iter_weight_chunks

log = logging.getLogger(__name__)
SERVICE_NAME = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"].full_name

Dispatch = Callable[[str, tuple[Any, ...]], Any]
RETRY_PUSHBACK = "grpc-retry-pushback-ms"


class LearnerServicer(learner_pb2_grpc.LearnerServiceServicer):
    """The learner service over gRPC on rank 0: decodes and checks each request, then runs
    it through ``LearnerCore`` (which relays it to every rank)."""

    def __init__(
        self,
        dispatch: Dispatch,
        info: Callable[[], learner_pb2.LearnerInfo],
        vocab_size: int,
        max_bytes: int,
        chunk_bytes: int,
        checkpoint_root: str | Path = "",
        weight_sync: WeightSyncConfig | None = None,
        channel: ChannelConfig | None = None,
        probe: Callable[[str, ChannelConfig | None, float], None] = probe_replica,
        finish_publish: Callable[[], WeightUpdateReport] | None = None,
    ) -> None:
        """``checkpoint_root``: learner.checkpoint_dir (empty: SaveCheckpoint refused);
        ``weight_sync``: allowed hosts and the probe deadline; ``channel``: how the probe
        reaches replicas (TLS, token); ``finish_publish``: rank 0's wait for the publish
        StartPublish began (``LearnerCore.finish_publish``; None: FinishPublish refused)."""
        self._finish_publish = finish_publish
        self._checkpoint_root = Path(checkpoint_root) if checkpoint_root else None
        self._weight_sync = weight_sync or WeightSyncConfig()
        self._channel = channel
        self._probe = probe
        self._dispatch = dispatch
        self._info = info
        self._vocab_size = vocab_size
        self._max_bytes = max_bytes
        self._chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        self._turns = threading.Condition()
        """Notified after every train step: steps sent ahead wait on it for their turn."""
        self._failed_from: int | None = None
        """The policy version the last failed train step started from."""
        self._reported = threading.Event()
        """Set while no background publish awaits its FinishPublish."""
        self._reported.set()
        self._joins = 0
        """Catch-up publishes so far (under the lock)."""
        self._joined: dict[str, int] = {}
        """Each replica caught up, with ``_joins`` after its last catch-up."""
        self.last_publish_s = 0.0
        """Seconds of the last PublishWeights (the Prometheus weight-sync gauge)."""

    def add_to_server(self, server: grpc.Server) -> None:
        """Registers this servicer on ``server`` (the process's main, without the
        generated code)."""
        learner_pb2_grpc.add_LearnerServiceServicer_to_server(self, server)

    def _run(self, command: str, *args: Any) -> Any:
        with self._lock:
            return self._dispatch(command, args)

    @handle_errors
    def TrainStep(
        self, request_iterator: Iterator[common_pb2.Chunk], context: grpc.ServicerContext
    ) -> learner_pb2.TrainStepResponse:
        """One step; with ``start_version`` in its turn, with ``publish_to`` followed by the
        start of its publish (see ``TrainBatch``). The batch is received and checked, and the
        targets probed, before the turn: beside the step ahead of it."""
        batch = receive_message(request_iterator, learner_pb2.TrainBatch, self._max_bytes)
        samples = convert.batch_from_proto(batch, self._vocab_size)
        targets = list(batch.publish_to)
        if targets:
            check_targets(targets, self._weight_sync.allowed_hosts)  # refused before it trains
        unreachable = self._unreachable(targets)
        start = batch.start_version if batch.HasField("start_version") else None
        deadline = time.monotonic() + _time_left(context)
        joins_seen = self._joins
        with self._turn(start, deadline, context):
            result = self._dispatch("train_step", (samples,))
            if targets and not unreachable:
                keep = self._keep(targets, joins_seen)
                result.publish_started = self._start_after_step(targets, keep, deadline)
        return convert.result_to_proto(result)

    def _unreachable(self, targets: list[str]) -> str:
        """Why a step's publish will not start ("" when every target answers its probe):
        the step trains all the same, and its caller publishes (and drops the dead)."""
        try:
            self._probe_each(targets)
        except Unavailable as exc:
            log.warning("not publishing after the train step: %s", exc)
            return str(exc)
        return ""

    def _start_after_step(self, targets: list[str], keep: list[str], deadline: float) -> bool:
        """Starts the step's publish once the one before was reported; False (logged) when
        it cannot: the step is applied, so its reply must not fail, and the caller
        publishes as it would have without ``publish_to``."""
        # Leaves the reply a second inside the call's deadline: the step's result must land.
        wait_until = min(deadline - 1.0, time.monotonic() + self._weight_sync.timeout_s)
        try:
            self._wait_reported(wait_until)
            self._dispatch("start_publish", (targets, keep))
        except Exception as exc:  # noqa: BLE001 — reported through publish_started
            log.warning("the train step's publish did not start: %s", exc)
            return False
        self._reported.clear()
        return True

    def _keep(self, targets: list[str], joins_seen: int) -> list[str]:
        """The replicas a step's publish keeps: its targets, and those that joined (a
        catch-up PublishWeights) since the step was sent, whose caller could not name them
        yet (the publish would otherwise close their new groups)."""
        joined = [t for t, n in self._joined.items() if n > joins_seen and t not in targets]
        return [*targets, *joined]

    @contextmanager
    def _turn(
        self, start_version: int | None, deadline: float, context: grpc.ServicerContext
    ) -> Iterator[None]:
        """Holds the command lock for one train step; with ``start_version``, only once the
        learner holds that version (waiting, until ``deadline``, while it is behind)."""
        if start_version is not None:
            context.add_callback(self._wake_turns)  # a cancelled call stops waiting
            with self._turns:
                while (now := self._version()) != start_version:
                    self._refuse_turn(start_version, now, deadline, context)
                    self._turns.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if start_version is not None and self._version() != start_version:
                raise FailedPrecondition(  # an unordered step ran first
                    f"this train step starts from policy version {start_version}; the "
                    f"learner is at {self._version()}"
                )
            try:
                yield
                self._failed_from = None
            except BaseException:
                self._failed_from = self._version()
                raise
            finally:
                self._wake_turns()

    def _wake_turns(self) -> None:
        with self._turns:
            self._turns.notify_all()

    def _refuse_turn(
        self, start_version: int, now: int, deadline: float, context: grpc.ServicerContext
    ) -> None:
        """Raises when a step waiting for ``start_version`` can no longer get it: the
        learner is past it, the last step failed where the learner still is (nothing will
        bring it to ``start_version`` in order), the deadline passed or the caller left (a
        coordinator that stopped must not have its step applied under the next one)."""
        if now > start_version:
            raise FailedPrecondition(
                f"this train step starts from policy version {start_version}, the learner "
                f"is already at {now}: it is not applied (again)"
            )
        if self._failed_from == now:
            raise FailedPrecondition(
                f"the train step that should have brought the learner from policy version "
                f"{now} failed; this one, from {start_version}, is not applied"
            )
        if not context.is_active():
            raise FailedPrecondition(
                f"the train step from policy version {start_version} was cancelled"
            )
        if time.monotonic() >= deadline:
            raise FailedPrecondition(
                f"this train step starts from policy version {start_version}; the learner "
                f"stayed at {now} until the call's deadline"
            )

    def _version(self) -> int:
        return int(self._info().policy_version)

    def _wait_reported(self, deadline: float) -> None:
        """Waits until the previous background publish was reported (FinishPublish): one
        publish in flight at a time, and its check done before the next one is sent."""
        if not self._reported.wait(max(0.0, deadline - time.monotonic())):
            raise FailedPrecondition(
                "the train step is done, but its publish cannot start: the previous one "
                "was not reported (FinishPublish) in time"
            )

    @handle_errors
    def ComputeLogProbs(
        self, request: learner_pb2.ComputeLogProbsRequest, context: grpc.ServicerContext
    ) -> learner_pb2.ComputeLogProbsResponse:
        prompts = unpack_tokens(request.prompts, "prompts")
        responses = unpack_tokens(request.responses, "responses")
        if len(prompts) != len(responses) or not prompts:
            raise ValueError("prompts and responses must be non-empty and of equal count")
        check_token_range(request.prompts, self._vocab_size, "prompts")
        check_token_range(request.responses, self._vocab_size, "responses")
        temperature = request.temperature or 1.0
        logprobs = self._run("compute_logprobs", prompts, responses, temperature)
        return learner_pb2.ComputeLogProbsResponse(
            logprobs=pack_float_seqs(logprobs),
            policy_version=self._info().policy_version,
        )

    @handle_errors
    def PublishWeights(
        self, request: learner_pb2.PublishWeightsRequest, context: grpc.ServicerContext
    ) -> learner_pb2.PublishWeightsResponse:
        targets = self._checked_targets(request.targets, context)
        with self._lock:
            report = self._dispatch("publish_weights", (targets, request.catch_up))
            if request.catch_up:
                self._joins += 1
                self._joined.update((t, self._joins) for t in targets)
        self.last_publish_s = report.duration_s
        return _report_to_proto(report)

    @handle_errors
    def StartPublish(
        self, request: learner_pb2.PublishWeightsRequest, context: grpc.ServicerContext
    ) -> learner_pb2.PublishWeightsResponse:
        version = self._run("start_publish", self._checked_targets(request.targets, context))
        self._reported.clear()
        return learner_pb2.PublishWeightsResponse(policy_version=version)

    @handle_errors
    def FinishPublish(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> learner_pb2.PublishWeightsResponse:
        if self._finish_publish is None:
            raise FailedPrecondition("this learner cannot publish in the background")
        try:  # rank 0 alone, outside the lock: train steps go on
            report = self._finish_publish()
        finally:
            self._reported.set()
        self.last_publish_s = report.duration_s
        return _report_to_proto(report)

    def _checked_targets(
        self, requested: Iterable[str], context: grpc.ServicerContext
    ) -> list[str]:
        """A request's targets, each on ``allowed_hosts`` and answering a probe."""
        targets = list(requested)
        check_targets(targets, self._weight_sync.allowed_hosts)
        try:
            self._probe_each(targets)
        except Unavailable:
            # Clients retry UNAVAILABLE; a negative pushback tells them not to, so a dead
            # replica is reported once, not after every retry's probe.
            context.set_trailing_metadata(((RETRY_PUSHBACK, "-1"),))
            raise
        return targets

    def _probe_each(self, targets: Iterable[str]) -> None:
        """Unavailable for the first target that does not answer its probe (called outside
        the lock: a dead target never blocks other calls)."""
        for target in targets:
            self._probe(target, self._channel, self._weight_sync.connect_timeout_s)

    @handle_errors
    def GetWeights(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.WeightChunk]:
        with self._lock:
            items = self._dispatch("full_weights", ())
            version = self._info().policy_version
        yield from iter_weight_chunks(items, version, self._chunk_bytes)

    @handle_errors
    def SaveCheckpoint(
        self, request: learner_pb2.SaveCheckpointRequest, context: grpc.ServicerContext
    ) -> learner_pb2.SaveCheckpointResponse:
        if self._checkpoint_root is None:
            raise FailedPrecondition(
                "SaveCheckpoint is disabled: learner.checkpoint_dir is not set"
            )
        resolve_checkpoint_target(self._checkpoint_root, request.path)  # refused before the lock
        path = self._run("save_checkpoint", request.path)
        return learner_pb2.SaveCheckpointResponse(
            path=path, policy_version=self._info().policy_version
        )

    @handle_errors
    def SaveTrainState(
        self, request: learner_pb2.TrainStateRequest, context: grpc.ServicerContext
    ) -> learner_pb2.TrainStateResponse:
        version = self._run("save_train_state", request.name)
        return learner_pb2.TrainStateResponse(path=request.name, policy_version=version)

    @handle_errors
    def LoadTrainState(
        self, request: learner_pb2.TrainStateRequest, context: grpc.ServicerContext
    ) -> learner_pb2.TrainStateResponse:
        version = self._run("load_train_state", request.name)
        return learner_pb2.TrainStateResponse(path=request.name, policy_version=version)

    @handle_errors
    def GetInfo(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> learner_pb2.LearnerInfo:
        return self._info()


def _report_to_proto(report: WeightUpdateReport) -> learner_pb2.PublishWeightsResponse:
    return learner_pb2.PublishWeightsResponse(
        policy_version=report.policy_version,
        num_bytes=report.num_bytes,
        duration_s=report.duration_s,
    )


def _time_left(context: grpc.ServicerContext) -> float:
    """Seconds to the call's deadline (a day when it has none)."""
    left = context.time_remaining()
    return 86_400.0 if left is None else max(0.0, float(left))
