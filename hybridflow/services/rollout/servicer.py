"""gRPC face of a rollout replica: proto → domain → LocalRollout → proto."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from hybridflow.rpc.errors import handle_errors
from hybridflow.services.rollout import convert
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc

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
    def GetInfo(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> rollout_pb2.RolloutInfo:
        return convert.status_to_proto(self._rollout.status())
