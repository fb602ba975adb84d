"""The rollout service's gRPC client (``RolloutClient`` in ``hybridflow.clients``; ``LocalRollout`` is
the in-process twin). Failed calls raise ``hybridflow.errors`` classes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hybridflow.arrays import TokenLike
from hybridflow.clients import RolloutClient
from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.client_errors import translate_errors
from hybridflow.rpc.config import ChannelConfig
from hybridflow.services.rollout import convert
from hybridflow.types import Completion, RolloutStatus, SamplingParams
from hybridflow.v1 import common_pb2, rollout_pb2_grpc

if TYPE_CHECKING:
    import grpc.aio

__all__ = ["GrpcRolloutClient", "RolloutClient", "async_status", "async_stub"]


class GrpcRolloutClient:
    """Talks to a rollout service over gRPC."""

    service = "rollout"
    """Names the service in failed calls' messages."""

    def __init__(self, address: str, config: ChannelConfig | None = None) -> None:
        self.address = address
        self._config = config or ChannelConfig()
        self._channel = make_channel(address, self._config)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)

    @translate_errors
    def generate(
        self, prompts: Sequence[TokenLike], params: SamplingParams, request_id: str = ""
    ) -> list[list[Completion]]:
        request = convert.generate_request(prompts, params, request_id or uuid.uuid4().hex[:12])
        groups: list[list[Completion]] = []
        for reply in self._stub.Generate(request, timeout=self._config.timeout_s):
            if reply.first_prompt_index != len(groups):
                raise RuntimeError(f"{self.address}: Generate stream out of order")
            flat = convert.completions_from_proto(reply.completions)
            n = params.n
            groups.extend(flat[i : i + n] for i in range(0, len(flat), n))
        if len(groups) != len(prompts):
            raise RuntimeError(
                f"{self.address}: got {len(groups)} groups for {len(prompts)} prompts"
            )
        return groups

    @translate_errors
    def status(self, timeout_s: float | None = None) -> RolloutStatus:
        reply = self._stub.GetInfo(common_pb2.Empty(), timeout=timeout_s or self._config.timeout_s)
        return convert.status_from_proto(reply)

    def close(self) -> None:
        self._channel.close()


def async_stub(channel: grpc.aio.Channel) -> Any:
    """The service's raw stub over an asyncio channel, for a caller that times the calls
    itself (the load generator); the schedule uses ``GrpcRolloutClient``."""
    return rollout_pb2_grpc.RolloutServiceStub(channel)


async def async_status(
    stub: Any, timeout_s: float, metadata: Sequence[tuple[str, str]]
) -> RolloutStatus:
    """``GetInfo`` over ``async_stub``'s stub; raises ``grpc.aio.AioRpcError`` as it comes."""
    reply = await stub.GetInfo(common_pb2.Empty(), timeout=timeout_s, metadata=metadata)
    return convert.status_from_proto(reply)
