"""Maps domain exceptions to gRPC status codes, in one place for every servicer.

ValueError (bad input) → INVALID_ARGUMENT with the message; ``hybridflow.errors.Unavailable``
(a dead engine) → UNAVAILABLE with its cause; ``DeliveryFailed`` → ABORTED; ``CheckpointCorrupt`` → DATA_LOSS and
``CheckpointRejected`` → FAILED_PRECONDITION (both name the file or key);
``FailedPrecondition``, ``AlreadyExists`` and ``ResourceExhausted`` → their status codes, as
are FileExistsError / FileNotFoundError (checkpoints: ALREADY_EXISTS / NOT_FOUND); a full disk
(OSError ENOSPC) → RESOURCE_EXHAUSTED naming the path and the free space; anything else,
``BaseException`` subclasses included (torch's ``CheckpointException`` is one) → INTERNAL and
a logged traceback. Only ``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit`` (a client
cancelling a stream) propagate, and an RPC the method already ended with ``context.abort``
keeps its status. The process keeps answering either way.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from hybridflow.errors import (
    AlreadyExists,
    CheckpointCorrupt,
    CheckpointRejected,
    DeliveryFailed,
    FailedPrecondition,
    ResourceExhausted,
    Unavailable,
)
from hybridflow.utils.disk import disk_full_message, is_disk_full

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

PROPAGATE: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit, GeneratorExit)
"""Never turned into a status: the process is being stopped, or the client went away."""

_REFUSALS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (CheckpointCorrupt, grpc.StatusCode.DATA_LOSS),  # before its base classes
    (DeliveryFailed, grpc.StatusCode.ABORTED),
    (CheckpointRejected, grpc.StatusCode.FAILED_PRECONDITION),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
)


def _already_aborted(context: grpc.ServicerContext, exc: BaseException) -> bool:
    """``context.abort`` raises a bare ``Exception()`` after setting the status: re-raise it
    (gRPC then sends that status) instead of overwriting it with INTERNAL."""
    code = getattr(context, "code", None)
    return type(exc) is Exception and not exc.args and callable(code) and code() is not None


def _abort(context: grpc.ServicerContext, exc: BaseException, method: str) -> Any:
    if isinstance(exc, ValueError):
        log.warning("%s: invalid argument: %s", method, exc)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, FileExistsError):
        context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
    if isinstance(exc, FileNotFoundError):
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    if isinstance(exc, OSError) and is_disk_full(exc):
        message = disk_full_message(exc.filename or "(unnamed file)", exc)
        log.error("%s: %s", method, message)
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
    if isinstance(exc, Unavailable):
        log.error("%s: unavailable: %s", method, exc)
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    for kind, code in _REFUSALS:
        if isinstance(exc, kind):
            log.warning("%s: %s: %s", method, code.name, exc)
            context.abort(code, str(exc))
    log.error("%s failed", method, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def handle_errors(fn: F) -> F:
    """Decorates a unary or stream-returning servicer method."""
    import inspect

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            try:
                yield from fn(self, request, context)
            except PROPAGATE:
                raise
            except BaseException as exc:  # noqa: BLE001 — mapped to a status, service stays up
                if _already_aborted(context, exc):
                    raise
                _abort(context, exc, fn.__qualname__)

        return gen_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except PROPAGATE:
            raise
        except BaseException as exc:  # noqa: BLE001 — mapped to a status, service stays up
            if _already_aborted(context, exc):
                raise
            return _abort(context, exc, fn.__qualname__)

    return wrapper  # type: ignore[return-value]
