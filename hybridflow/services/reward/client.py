"""The reward service's gRPC client (``RewardClient`` in ``hybridflow.clients``; ``RewardScorer`` is
the in-process twin). Failed calls raise ``hybridflow.errors`` classes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hybridflow.clients import RewardClient
from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.client_errors import translate_errors
from hybridflow.rpc.config import ChannelConfig
from hybridflow.services.reward import convert
from hybridflow.types import ScoreItem, ScoreResult
from hybridflow.v1 import reward_pb2_grpc

if TYPE_CHECKING:
    import grpc.aio

__all__ = ["GrpcRewardClient", "RewardClient", "async_stub"]


class GrpcRewardClient:
    """The reward service as the coordinator calls it (``clients.Reward``), with gRPC errors
    translated into ``hybridflow.errors``."""

    service = "reward"
    """Names the service in failed calls' messages."""

    def __init__(self, address: str, config: ChannelConfig | None = None) -> None:
        self.address = address
        self._config = config or ChannelConfig()
        self._channel = make_channel(address, self._config)
        self._stub = reward_pb2_grpc.RewardServiceStub(self._channel)

    @translate_errors
    def score_batch(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        reply = self._stub.Score(convert.items_to_proto(items), timeout=self._config.timeout_s)
        results = convert.results_from_proto(reply)
        if len(results) != len(items):
            raise RuntimeError(f"{self.address}: {len(results)} scores for {len(items)} items")
        return results

    def close(self) -> None:
        self._channel.close()


def async_stub(channel: grpc.aio.Channel) -> Any:
    """The service's raw stub over an asyncio channel, for a caller that times the calls
    itself (the load generator); the schedule uses ``GrpcRewardClient``."""
    return reward_pb2_grpc.RewardServiceStub(channel)
