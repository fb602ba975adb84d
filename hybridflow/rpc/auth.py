"""Shared-token authentication: a server interceptor and a client call-credentials helper.

With a token configured every call but health and reflection must carry it. With none, the
RPCs that change state (``STATE_CHANGING_METHODS``) are refused unless the server explicitly
allows unauthenticated access (a trusted sandbox); read-only RPCs stay open.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

TOKEN_HEADER = "authorization"
_EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_PACKAGE_PREFIX = "/hybridflow.v1."

STATE_CHANGING_METHODS: set[str] = {
    # learner
    "TrainStep",
    "PublishWeights",
    "SaveCheckpoint",
    "SaveTrainState",
    "LoadTrainState",
    # weight sync (served by every rollout replica)
    "UpdateWeights",
    "JoinWeightSync",
    "ReceiveWeights",
    "ProbeLogprobs",  # read-only, but a forward pass on demand: callers need the token too
    # coordinator control
    "Pause",
    "Resume",
    "Stop",
    "Scale",
    # environment episodes (a Reset instantiates an allow-listed class)
    "Reset",
    "Step",
    "Close",
}
"""Method names (of any hybridflow.v1 service) that need a token even when none is configured.
A new state-changing RPC is added here."""

NO_TOKEN_MESSAGE = (
    "{method} changes state and this server has no auth token: set HYBRIDFLOW_TOKEN "
    "(or server.auth_token_file) on the server and its clients, or server.allow_unauthenticated"
    "=true in a trusted sandbox"
)


def is_exempt(method: str) -> bool:
    """Health and reflection: always open, never counted or limited."""
    return method.startswith(_EXEMPT)


def is_state_changing(method: str) -> bool:
    """``method`` is a full gRPC method name, ``/package.Service/Method``."""
    if not method.startswith(_PACKAGE_PREFIX):
        return False
    return method.rsplit("/", 1)[-1] in STATE_CHANGING_METHODS


def _deny_handler(message: str) -> grpc.RpcMethodHandler:
    # A stream-request handler accepts any call shape without reading its payload.
    def deny(request_iterator: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.stream_unary_rpc_method_handler(deny)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>``; health checks stay open."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"
        self._deny = _deny_handler("missing or wrong auth token")

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if is_exempt(method):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        got = str(metadata.get(TOKEN_HEADER, ""))
        if hmac.compare_digest(got, self._expected):
            return continuation(handler_call_details)
        return self._deny


class NoTokenInterceptor(grpc.ServerInterceptor):
    """No token configured: state-changing RPCs are refused, naming how to set one."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if is_state_changing(method):
            return _deny_handler(NO_TOKEN_MESSAGE.format(method=method))
        return continuation(handler_call_details)


class TokenClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the shared token to every outgoing call (works without TLS, unlike call creds)."""

    def __init__(self, token: str) -> None:
        self._header = (TOKEN_HEADER, f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = list(details.metadata or []) + [self._header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)
