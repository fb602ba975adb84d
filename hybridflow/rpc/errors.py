"""Maps domain exceptions to gRPC status codes, in one place for every servicer.

ValueError (bad input) → INVALID_ARGUMENT with the message; ``hybridflow.errors.Unavailable``
(a dead engine) → UNAVAILABLE with its cause; ``FailedPrecondition``, ``AlreadyExists`` and
``ResourceExhausted`` → their status codes, as are FileExistsError / FileNotFoundError
(checkpoints: ALREADY_EXISTS / NOT_FOUND); anything else → INTERNAL and a logged traceback.
The process keeps answering either way.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from hybridflow.errors import AlreadyExists, FailedPrecondition, ResourceExhausted, Unavailable

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

_REFUSALS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
)


def _abort(context: grpc.ServicerContext, exc: BaseException, method: str) -> Any:
    if isinstance(exc, ValueError):
        log.warning("%s: invalid argument: %s", method, exc)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, FileExistsError):
        context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
    if isinstance(exc, FileNotFoundError):
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    if isinstance(exc, Unavailable):
        log.error("%s: unavailable: %s", method, exc)
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    for kind, code in _REFUSALS:
        if isinstance(exc, kind):
            log.warning("%s: %s: %s", method, code.name, exc)
            context.abort(code, str(exc))
    log.exception("%s failed", method)
    context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def handle_errors(fn: F) -> F:
    """Decorates a unary or stream-returning servicer method."""
    import inspect

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            try:
                yield from fn(self, request, context)
            except Exception as exc:  # noqa: BLE001 — mapped to a status, service stays up
                _abort(context, exc, fn.__qualname__)

        return gen_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except Exception as exc:  # noqa: BLE001 — mapped to a status, service stays up
            return _abort(context, exc, fn.__qualname__)

    return wrapper  # type: ignore[return-value]
