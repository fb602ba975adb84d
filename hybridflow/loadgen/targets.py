"""The gRPC side of the load generator: one asyncio channel and a target per service kind.

The only loadgen module that imports grpc or handles protos: the services' clients give it
their raw asyncio stubs and their convert modules build its requests. Calls carry a deadline and are never
retried (an UNAVAILABLE service must show up as UNAVAILABLE errors, not as slow requests).
Request bodies are built once (``workload``) and converted to protos before the run.
"""

from __future__ import annotations

import os
import time
from typing import Any

import grpc
import grpc.aio

from hybridflow.loadgen.config import LoadgenConfig
from hybridflow.loadgen.runner import AsyncTarget, Outcome
from hybridflow.loadgen.stats import BAD_RESPONSE
from hybridflow.loadgen.workload import reward_item_pool, rollout_prompt_pool, sampling_params
from hybridflow.rpc.auth import TOKEN_HEADER
from hybridflow.services.reward import client as reward_client
from hybridflow.services.reward import convert as reward_convert
from hybridflow.services.rollout import client as rollout_client
from hybridflow.services.rollout import convert as rollout_convert

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
TOKEN_ENV = "HYBRIDFLOW_TOKEN"
"""Shared auth token, sent with every call when set (as the services expect)."""


class TargetUnavailable(RuntimeError):
    """The target could not be prepared (e.g. GetInfo failed); nothing was measured."""


def open_channel(address: str) -> grpc.aio.Channel:
    """A plaintext asyncio channel without retries."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
    ]
    return grpc.aio.insecure_channel(address, options=options)


def _metadata() -> tuple[tuple[str, str], ...]:
    token = os.environ.get(TOKEN_ENV, "")
    return ((TOKEN_HEADER, f"Bearer {token}"),) if token else ()


class RolloutTarget:
    """Generate calls; the first streamed response marks the time to first result."""

    def __init__(self, channel: grpc.aio.Channel, requests: list[Any], num_completions: int):
        self._stub = rollout_client.async_stub(channel)
        self._requests = requests
        self._num_completions = num_completions
        self._metadata = _metadata()

    async def call(self, index: int, timeout_s: float) -> Outcome:
        request = self._requests[index % len(self._requests)]
        first: float | None = None
        num_tokens = 0
        num_completions = 0
        try:
            call = self._stub.Generate(request, timeout=timeout_s, metadata=self._metadata)
            async for reply in call:
                if first is None:
                    first = time.perf_counter()
                offsets = reply.completions.tokens.offsets
                if offsets:  # token counts come from the offsets: no need to unpack
                    num_tokens += offsets[-1]
                    num_completions += len(offsets) - 1
        except grpc.aio.AioRpcError as exc:
            return Outcome(exc.code().name)
        code = "OK" if num_completions == self._num_completions else BAD_RESPONSE
        return Outcome(code, first, num_tokens, num_completions)


class RewardTarget:
    """Score calls (unary: no separate time to first result)."""

    def __init__(self, channel: grpc.aio.Channel, requests: list[Any], num_items: int):
        self._stub = reward_client.async_stub(channel)
        self._requests = requests
        self._num_items = num_items
        self._metadata = _metadata()

    async def call(self, index: int, timeout_s: float) -> Outcome:
        request = self._requests[index % len(self._requests)]
        try:
            reply = await self._stub.Score(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            return Outcome(exc.code().name)
        num = len(reply.results)
        code = "OK" if num == self._num_items else BAD_RESPONSE
        return Outcome(code, None, 0, num, int(reply.num_errors))


async def make_target(cfg: LoadgenConfig, channel: grpc.aio.Channel) -> AsyncTarget:
    """Builds the request pool; for rollout first asks the service for its vocab and EOS."""
    if cfg.target == "reward":
        items = reward_item_pool(cfg.reward, cfg.seed)
        return RewardTarget(
            channel, [reward_convert.items_to_proto(b) for b in items], cfg.reward.items_per_request
        )
    stub = rollout_client.async_stub(channel)
    try:
        info = await rollout_client.async_status(stub, cfg.timeout_s, _metadata())
    except grpc.aio.AioRpcError as exc:
        raise TargetUnavailable(
            f"rollout GetInfo at {cfg.address} failed: {exc.code().name}: {exc.details()}"
        ) from exc
    params = sampling_params(cfg.rollout)
    pool = rollout_prompt_pool(cfg.rollout, int(info.vocab_size), info.eos_token_id, cfg.seed)
    requests = [
        rollout_convert.generate_request(prompts, params, f"loadgen-{cfg.seed}-{k}")
        for k, prompts in enumerate(pool)
    ]
    return RolloutTarget(channel, requests, cfg.rollout.prompts_per_request * cfg.rollout.n)
