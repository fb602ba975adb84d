"""gRPC face of the learner (rank 0 only): proto → domain → relayed command → proto.

``dispatch(command, args)`` runs the command on every rank (via the relay when the world is
larger than one); a lock keeps relayed commands in one order on all ranks.

What a caller may make the learner do is bounded here, before the lock is taken:
SaveCheckpoint writes only under ``checkpoint_root`` (a relative, new name), PublishWeights
reaches only ``host:port`` targets on ``weight_sync.allowed_hosts`` that answer a Describe
probe within ``weight_sync.connect_timeout_s``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
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
        batch = receive_message(request_iterator, learner_pb2.TrainBatch, self._max_bytes)
        samples = convert.batch_from_proto(batch, self._vocab_size)
        return convert.result_to_proto(self._run("train_step", samples))

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
        targets = self._checked_targets(request, context)
        report = self._run("publish_weights", targets, request.catch_up)
        self.last_publish_s = report.duration_s
        return _report_to_proto(report)

    @handle_errors
    def StartPublish(
        self, request: learner_pb2.PublishWeightsRequest, context: grpc.ServicerContext
    ) -> learner_pb2.PublishWeightsResponse:
        version = self._run("start_publish", self._checked_targets(request, context))
        return learner_pb2.PublishWeightsResponse(policy_version=version)

    @handle_errors
    def FinishPublish(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> learner_pb2.PublishWeightsResponse:
        if self._finish_publish is None:
            raise FailedPrecondition("this learner cannot publish in the background")
        report = self._finish_publish()  # rank 0 alone, outside the lock: train steps go on
        self.last_publish_s = report.duration_s
        return _report_to_proto(report)

    def _checked_targets(
        self, request: learner_pb2.PublishWeightsRequest, context: grpc.ServicerContext
    ) -> list[str]:
        """The request's targets, each on ``allowed_hosts`` and answering a probe."""
        targets = list(request.targets)
        check_targets(targets, self._weight_sync.allowed_hosts)
        for target in targets:  # outside the lock: a dead target never blocks other calls
            try:
                self._probe(target, self._channel, self._weight_sync.connect_timeout_s)
            except Unavailable:
                # Clients retry UNAVAILABLE; a negative pushback tells them not to, so a dead
                # replica is reported once, not after every retry's probe.
                context.set_trailing_metadata(((RETRY_PUSHBACK, "-1"),))
                raise
        return targets

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
