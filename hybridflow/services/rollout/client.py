"""Rollout client interface, its gRPC implementation; ``LocalRollout`` is the in-process twin."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from hybridflow.arrays import TokenLike
from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.config import ChannelConfig
from hybridflow.services.rollout import convert
from hybridflow.types import Completion, RolloutStatus, SamplingParams
from hybridflow.v1 import common_pb2, rollout_pb2_grpc


class RolloutClient(Protocol):
    """What the coordinator and RLTrainer need from a rollout replica."""

    def generate(
        self, prompts: Sequence[TokenLike], params: SamplingParams, request_id: str = ""
    ) -> list[list[Completion]]: ...

    def status(self, timeout_s: float | None = None) -> RolloutStatus:
        """What the replica serves; ``timeout_s``: this call's deadline (None: the default)."""
        ...


class GrpcRolloutClient:
    """Talks to a rollout service over gRPC."""

    def __init__(self, address: str, config: ChannelConfig | None = None) -> None:
        self.address = address
        self._config = config or ChannelConfig()
        self._channel = make_channel(address, self._config)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)

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

    def status(self, timeout_s: float | None = None) -> RolloutStatus:
        reply = self._stub.GetInfo(common_pb2.Empty(), timeout=timeout_s or self._config.timeout_s)
        return convert.status_from_proto(reply)

    def close(self) -> None:
        self._channel.close()
