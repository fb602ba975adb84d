"""Shared-token authentication: a server interceptor and a client call-credentials helper."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

TOKEN_HEADER = "authorization"
_EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>``; health checks stay open."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method.startswith(_EXEMPT):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        got = str(metadata.get(TOKEN_HEADER, ""))
        if hmac.compare_digest(got, self._expected):
            return continuation(handler_call_details)
        return self._deny


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
