"""gRPC face of a rollout replica: proto → domain → LocalRollout → proto.

Every Generate is bounded before any work (``rollout.max_*`` limits, checked on the raw
message before prompts are unpacked) and ends within one decode step once its caller is gone
(a cancelled call or an expired deadline sets the request's stop flag).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

import grpc

from hybridflow.rpc.errors import handle_errors
from hybridflow.services.rollout import convert
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.services.rollout.requests import Cancelled, RequestLimits, check_request_limits
from hybridflow.types import Completion
from hybridflow.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name

log = logging.getLogger(__name__)


def check_generate_limits(request: rollout_pb2.GenerateRequest, limits: RequestLimits) -> None:
    """The request's size from its raw fields (nothing unpacked or allocated yet)."""
    check_request_limits(
        num_prompts=max(len(request.prompts.offsets) - 1, 0),
        num_prompt_tokens=len(request.prompts.token_ids) // 4,
        n=request.sampling.n,
        max_new_tokens=request.sampling.max_new_tokens,
        limits=limits,
    )


def message_spans(
    groups: Sequence[Sequence[Completion]], max_prompts: int, target_bytes: int
) -> Iterator[tuple[int, int]]:
    """[first, end) prompt ranges of the response messages: at most ``max_prompts`` each,
    ending once a message holds ~``target_bytes`` (8 bytes per token: id and log-prob)."""
    first, size = 0, 0
    for i, group in enumerate(groups):
        size += 8 * sum(c.token_ids.size for c in group)
        if i + 1 - first >= max_prompts or size >= target_bytes:
            yield first, i + 1
            first, size = i + 1, 0
    if first < len(groups):
        yield first, len(groups)


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """The rollout service over gRPC: validates each request's bounds before any work,
    streams completions back in ``rollout.message_bytes`` messages, and cancels generation
    when the caller goes away. The engine behind it is ``LocalRollout``'s."""

    def __init__(
        self,
        rollout: LocalRollout,
        prompts_per_message: int,
        max_bytes: int,
        limits: RequestLimits | None = None,
        message_bytes: int = 1 << 20,
    ) -> None:
        self._rollout = rollout
        self._prompts_per_message = prompts_per_message
        self._message_bytes = message_bytes
        self._max_bytes = max_bytes
        self._limits = limits or RequestLimits()

    def add_to_server(self, server: grpc.Server) -> None:
        """Registers this servicer on ``server`` (the process's main, without the
        generated code)."""
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(self, server)

    @handle_errors
    def Generate(
        self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[rollout_pb2.GenerateResponse]:
        check_generate_limits(request, self._limits)
        prompts, params = convert.parse_generate_request(request)
        gone = threading.Event()
        if not context.add_callback(gone.set):  # the call already ended
            return
        try:
            groups = self._rollout.generate(prompts, params, request.request_id, gone.is_set)
        except Cancelled as exc:
            log.info("Generate %r: %s", request.request_id, exc)
            return
        for first, end in message_spans(groups, self._prompts_per_message, self._message_bytes):
            yield convert.generate_response(request.request_id, first, groups[first:end])

    @handle_errors
    def GetInfo(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> rollout_pb2.RolloutInfo:
        return convert.status_to_proto(self._rollout.status())
