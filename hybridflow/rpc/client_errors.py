"""The gRPC clients' side of ``hybridflow.errors``: a failed call becomes a domain exception.

``translate_errors`` decorates a client method: a ``grpc.RpcError`` it raises (unary or while
reading a stream) is re-raised as the domain class of its status code (``STATUS_KINDS``;
any other code: ``ServiceError``), naming the service (``service``) and its address, the
client method, and for a deadline the seconds waited (``_config.timeout_s``): "learner at
HOST:PORT: DEADLINE_EXCEEDED after 120s in load_train_state: ...". The raised object is also a
``grpc.RpcError`` with the original ``code()`` and ``details()``, so code that speaks gRPC
keeps working while the coordinator and the schedule catch only the domain classes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from hybridflow.errors import (
    AlreadyExists,
    BadRequest,
    CheckpointCorrupt,
    DeliveryFailed,
    FailedPrecondition,
    ResourceExhausted,
    ServiceError,
    Unavailable,
)

F = TypeVar("F", bound=Callable[..., Any])

STATUS_KINDS: dict[grpc.StatusCode, type[Exception]] = {
    grpc.StatusCode.DATA_LOSS: CheckpointCorrupt,
    grpc.StatusCode.ABORTED: DeliveryFailed,
    grpc.StatusCode.INVALID_ARGUMENT: BadRequest,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
}
"""Status code → domain class; every other code becomes ``ServiceError``."""


class _RpcFailure(grpc.RpcError):
    """Mixin: the gRPC face of a translated error."""

    _code: grpc.StatusCode
    _details: str

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


_CLASSES: dict[type[Exception], type[Exception]] = {}


def _translated_class(kind: type[Exception]) -> type[Exception]:
    if kind not in _CLASSES:
        _CLASSES[kind] = type(kind.__name__, (kind, _RpcFailure), {})  # prints as its kind
    return _CLASSES[kind]


def translate(
    exc: grpc.RpcError, target: str, method: str = "", timeout_s: float | None = None
) -> Exception:
    """The domain exception for ``exc`` (a failed call of ``method`` to ``target``)."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None  # type: ignore[attr-defined]
    details = exc.details() if callable(getattr(exc, "details", None)) else ""  # type: ignore[attr-defined]
    kind = STATUS_KINDS.get(code, ServiceError) if code is not None else ServiceError
    name = getattr(code, "name", "UNKNOWN")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and timeout_s is not None:
        name += f" after {timeout_s:g}s"
    if method:
        name += f" in {method}"
    error = _translated_class(kind)(f"{target}: {name}: {details or ''}".rstrip(": "))
    error._code = code  # type: ignore[attr-defined]
    error._details = details or ""  # type: ignore[attr-defined]
    return error


def translate_errors(method: F) -> F:
    """Decorates a client method (``self.service`` and ``self.address`` name the service in
    the message, ``self._config.timeout_s`` the deadline)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except grpc.RpcError as exc:
            if isinstance(exc, _RpcFailure):
                raise
            address = getattr(self, "address", "service")
            service = getattr(self, "service", "")
            target = f"{service} at {address}" if service else address
            timeout_s = getattr(getattr(self, "_config", None), "timeout_s", None)
            raise translate(exc, target, method.__name__, timeout_s) from exc

    return wrapper  # type: ignore[return-value]
