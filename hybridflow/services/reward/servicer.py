"""gRPC face of the reward service: proto → domain → RewardScorer → proto."""

from __future__ import annotations

import grpc

from hybridflow.rpc.errors import handle_errors
from hybridflow.services.reward import convert
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.v1 import common_pb2, reward_pb2, reward_pb2_grpc

SERVICE_NAME = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, scorer: RewardScorer) -> None:
        self._scorer = scorer

    @handle_errors
    def Score(
        self, request: reward_pb2.ScoreRequest, context: grpc.ServicerContext
    ) -> reward_pb2.ScoreResponse:
        items = convert.items_from_proto(request)
        return convert.results_to_proto(self._scorer.score_batch(items))

    @handle_errors
    def GetInfo(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> reward_pb2.RewardInfo:
        return reward_pb2.RewardInfo(
            scorers=self._scorer.registry.names(),
            num_scored=self._scorer.num_scored,
            num_errors=sum(self._scorer.error_counts.values()),
        )
