"""gRPC face of a weight receiver (a rollout replica): proto → domain → receiver → proto.

Served by the rollout process beside its RolloutService; the learner reaches replicas only
through this service (``hybridflow.weights.client``). A replica joins only a group whose store
is on ``weight_sync.allowed_hosts`` and waits at most ``weight_sync.timeout_s`` for it; new
weights are checked (names, shapes, finite values, a version not older than the replica's)
before anything is staged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import grpc

from hybridflow.arrays import FloatArray
from hybridflow.rpc.errors import handle_errors
from hybridflow.types import WeightUpdateReport
from hybridflow.v1 import common_pb2, weight_sync_pb2, weight_sync_pb2_grpc
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.convert import (
    group_spec_from_proto,
    receive_weights,
    replica_description_to_proto,
    stream_bound,
)
from hybridflow.weights.spec import GroupSpec, ReplicaDescription

if TYPE_CHECKING:
    import torch

    from hybridflow.resharding.layout import ReplicaLayout

MAX_PROBE_TOKENS = 1024
"""Longest sequence a ProbeLogprobs call may ask about (the learner's probe is ~32)."""

SERVICE_NAME = weight_sync_pb2.DESCRIPTOR.services_by_name["WeightSyncService"].full_name


class WeightReceiver(Protocol):
    """What serves weights: ``LocalRollout`` (over either engine)."""

    @property
    def tensor_parallel_size(self) -> int: ...

    @property
    def policy_version(self) -> int: ...

    def load_weights(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]], policy_version: int
    ) -> WeightUpdateReport: ...

    def weight_layout(self) -> ReplicaLayout: ...

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str: ...

    def receive_weights(self, policy_version: int) -> WeightUpdateReport: ...

    def probe_logprobs(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> tuple[FloatArray, int]: ...


class WeightSyncServicer(weight_sync_pb2_grpc.WeightSyncServiceServicer):
    """A replica's weight-sync service over gRPC: whole-weight streams, ``Describe`` (its TP
    size, layout and dtype), and joining / receiving over the learner's torch.distributed group."""

    def __init__(
        self,
        receiver: WeightReceiver,
        max_bytes: int | None = None,
        config: WeightSyncConfig | None = None,
    ) -> None:
        """``max_bytes``: the most a whole ``UpdateWeights`` stream may declare; None: twice
        the replica's own weights at 4 bytes an element (``convert.stream_bound``)."""
        self._receiver = receiver
        self._max_bytes = max_bytes
        self._config = config or WeightSyncConfig()

    def add_to_server(self, server: grpc.Server) -> None:
        """Registers this servicer on ``server`` (the process's main, without the
        generated code)."""
        weight_sync_pb2_grpc.add_WeightSyncServiceServicer_to_server(self, server)

    @handle_errors
    def UpdateWeights(
        self, request_iterator: Iterator[common_pb2.WeightChunk], context: grpc.ServicerContext
    ) -> weight_sync_pb2.UpdateWeightsResponse:
        start = time.perf_counter()
        if self._max_bytes is None:  # the layout is the loaded model's: fixed for its life
            self._max_bytes = stream_bound(self._receiver.weight_layout())
        version, tensors, num_bytes = receive_weights(request_iterator, self._max_bytes)
        self._receiver.load_weights(tensors, version)
        return weight_sync_pb2.UpdateWeightsResponse(
            policy_version=version, num_bytes=num_bytes, duration_s=time.perf_counter() - start
        )

    @handle_errors
    def Describe(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> weight_sync_pb2.WeightSyncInfo:
        description = ReplicaDescription(
            self._receiver.tensor_parallel_size, self._receiver.weight_layout()
        )
        return replica_description_to_proto(description, self._receiver.policy_version)

    @handle_errors
    def JoinWeightSync(
        self, request: weight_sync_pb2.JoinWeightSyncRequest, context: grpc.ServicerContext
    ) -> weight_sync_pb2.JoinWeightSyncResponse:
        spec = group_spec_from_proto(request)
        if spec.store_host not in self._config.allowed_hosts:
            raise ValueError(
                f"store_host {spec.store_host!r} is not in weight_sync.allowed_hosts "
                f"{sorted(self._config.allowed_hosts)}"
            )
        if spec.timeout_s > self._config.timeout_s:
            raise ValueError(
                f"timeout_s {spec.timeout_s:g} exceeds weight_sync.timeout_s="
                f"{self._config.timeout_s:g}"
            )
        plan_hash = self._receiver.join_weight_sync(spec, request.replica_index)
        return weight_sync_pb2.JoinWeightSyncResponse(plan_hash=plan_hash)

    @handle_errors
    def ReceiveWeights(
        self, request: weight_sync_pb2.ReceiveWeightsRequest, context: grpc.ServicerContext
    ) -> weight_sync_pb2.UpdateWeightsResponse:
        report = self._receiver.receive_weights(request.policy_version)
        return weight_sync_pb2.UpdateWeightsResponse(
            policy_version=report.policy_version,
            num_bytes=report.num_bytes,
            duration_s=report.duration_s,
        )

    @handle_errors
    def ProbeLogprobs(
        self, request: weight_sync_pb2.ProbeLogprobsRequest, context: grpc.ServicerContext
    ) -> weight_sync_pb2.ProbeLogprobsResponse:
        prompt, response = list(request.prompt_ids), list(request.response_ids)
        if not prompt or not response:
            raise ValueError("ProbeLogprobs: prompt_ids and response_ids must both be non-empty")
        if len(prompt) + len(response) > MAX_PROBE_TOKENS:
            raise ValueError(
                f"ProbeLogprobs: {len(prompt) + len(response)} tokens, at most {MAX_PROBE_TOKENS}"
            )
        logprobs, version = self._receiver.probe_logprobs(prompt, response)
        return weight_sync_pb2.ProbeLogprobsResponse(
            logprobs=[float(x) for x in logprobs], policy_version=version
        )
