"""gRPC face of a rollout replica: proto → domain → LocalRollout → proto."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc

from hybridflow.rpc.errors import handle_errors
from hybridflow.services.rollout import convert
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from hybridflow.weights.grpc_stream import receive_weights

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, rollout: LocalRollout, prompts_per_message: int, max_bytes: int) -> None:
        self._rollout = rollout
        self._prompts_per_message = prompts_per_message
        self._max_bytes = max_bytes

    @handle_errors
    def Generate(
        self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[rollout_pb2.GenerateResponse]:
        prompts, params = convert.parse_generate_request(request)
        groups = self._rollout.generate(prompts, params, request.request_id)
        step = self._prompts_per_message
        for first in range(0, len(groups), step):
            part = groups[first : first + step]
            yield rollout_pb2.GenerateResponse(
                request_id=request.request_id,
                first_prompt_index=first,
                num_prompts=len(part),
                completions=convert.completions_to_proto([c for g in part for c in g]),
            )

    @handle_errors
    def UpdateWeights(
        self, request_iterator: Iterator[common_pb2.WeightChunk], context: grpc.ServicerContext
    ) -> rollout_pb2.UpdateWeightsResponse:
        start = time.perf_counter()
        version, tensors, num_bytes = receive_weights(request_iterator, self._max_bytes)
        self._rollout.load_weights(tensors, version)
        return rollout_pb2.UpdateWeightsResponse(
            policy_version=version, num_bytes=num_bytes, duration_s=time.perf_counter() - start
        )

    @handle_errors
    def JoinWeightSync(
        self, request: rollout_pb2.JoinWeightSyncRequest, context: grpc.ServicerContext
    ) -> rollout_pb2.JoinWeightSyncResponse:
        plan_hash = self._rollout.join_weight_sync(
            convert.group_spec_from_proto(request), request.replica_index
        )
        return rollout_pb2.JoinWeightSyncResponse(plan_hash=plan_hash)

    @handle_errors
    def ReceiveWeights(
        self, request: rollout_pb2.ReceiveWeightsRequest, context: grpc.ServicerContext
    ) -> rollout_pb2.UpdateWeightsResponse:
        report = self._rollout.receive_weights(request.policy_version)
        return rollout_pb2.UpdateWeightsResponse(
            policy_version=report.policy_version,
            num_bytes=report.num_bytes,
            duration_s=report.duration_s,
        )

    @handle_errors
    def GetInfo(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> rollout_pb2.RolloutInfo:
        return convert.status_to_proto(self._rollout.status())
