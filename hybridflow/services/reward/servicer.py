"""gRPC face of the reward service: proto → domain → RewardScorer → proto.

Each Score is bounded before conversion: ``reward.max_items_per_request`` items and
``reward.max_text_bytes`` per text field."""

from __future__ import annotations

import grpc

from hybridflow.rpc.errors import handle_errors
from hybridflow.services.reward import convert
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.v1 import common_pb2, reward_pb2, reward_pb2_grpc

SERVICE_NAME = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name

_TEXT_FIELDS = ("data_source", "response", "ground_truth", "prompt", "extra_info_json")


def check_score_limits(
    request: reward_pb2.ScoreRequest, max_items: int, max_text_bytes: int
) -> None:
    """ValueError naming the reward.* key a request exceeds."""
    if len(request.items) > max_items:
        raise ValueError(
            f"{len(request.items)} items exceed reward.max_items_per_request={max_items}"
        )
    for i, item in enumerate(request.items):
        for name in _TEXT_FIELDS:
            text = getattr(item, name)
            # len(str) bounds the UTF-8 size from below; encode only when it may exceed.
            if len(text) * 4 > max_text_bytes and len(text.encode()) > max_text_bytes:
                raise ValueError(
                    f"items[{i}].{name} is {len(text.encode())} bytes, more than "
                    f"reward.max_text_bytes={max_text_bytes}"
                )


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    """The reward service over gRPC: checks each request's bounds, scores its items with the
    configured scorers and components; one item's failure is that item's error, not the batch's."""

    def __init__(self, scorer: RewardScorer, config: RewardConfig | None = None) -> None:
        self._scorer = scorer
        self._config = config or RewardConfig()

    def add_to_server(self, server: grpc.Server) -> None:
        """Registers this servicer on ``server`` (the process's main, without the
        generated code)."""
        reward_pb2_grpc.add_RewardServiceServicer_to_server(self, server)

    @handle_errors
    def Score(
        self, request: reward_pb2.ScoreRequest, context: grpc.ServicerContext
    ) -> reward_pb2.ScoreResponse:
        check_score_limits(request, self._config.max_items_per_request, self._config.max_text_bytes)
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
            components=[c.name for c in self._scorer.config.components],
            num_truncated=self._scorer.num_truncated,
        )
