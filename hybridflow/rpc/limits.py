"""Server-side guards every service gets: a concurrency limit that sheds load at once, and an
idle timeout on client streams so a stalled sender cannot hold a worker thread forever.

Health and reflection are never counted; the server's pool keeps a few threads beyond the
limit (``server.reserved_workers``) so they, and refusals, are always answered. Knows
nothing of what the services do.

Requests are decoded here, not by grpcio: grpcio 1.85 leaks about 20 KB per request it
fails to deserialize (measured on a bare server: 10,000 undecodable requests, +190 MB), so
the handlers take raw bytes and an undecodable request is INVALID_ARGUMENT with nothing kept.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from hybridflow.rpc.auth import is_exempt

log = logging.getLogger(__name__)


class IdleWatchdog:
    """One thread that cancels registered RPCs whose stream has been idle too long."""

    def __init__(self, idle_timeout_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._watched: dict[int, tuple[float, grpc.ServicerContext, str]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.num_cancelled = 0
        """Streams cancelled for being idle (observable by tests and logs)."""

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="stream-idle", daemon=True)
            self._thread.start()

    def watch(self, context: grpc.ServicerContext, method: str) -> int:
        with self._lock:
            key = next(self._ids)
            self._watched[key] = (time.monotonic() + self.idle_timeout_s, context, method)
            self._ensure_thread()
        return key

    def touch(self, key: int) -> None:
        with self._lock:
            entry = self._watched.get(key)
            if entry is not None:
                self._watched[key] = (time.monotonic() + self.idle_timeout_s, *entry[1:])

    def unwatch(self, key: int) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _loop(self) -> None:
        interval = min(1.0, self.idle_timeout_s / 4)
        while not self._closed:
            self._wake.wait(interval)
            now = time.monotonic()
            with self._lock:
                expired = [(k, v) for k, v in self._watched.items() if v[0] <= now]
                for key, _ in expired:
                    del self._watched[key]
            for _, (_, context, method) in expired:
                log.warning(
                    "%s: no message for server.stream_idle_timeout_s=%gs, cancelling",
                    method,
                    self.idle_timeout_s,
                )
                self.num_cancelled += 1
                context.cancel()


class _WatchedStream:
    """A request iterator that re-arms the idle watchdog on every message."""

    def __init__(self, it: Iterator[Any], watchdog: IdleWatchdog, key: int) -> None:
        self._it = it
        self._watchdog = watchdog
        self._key = key

    def __iter__(self) -> _WatchedStream:
        return self

    def __next__(self) -> Any:
        try:
            item = next(self._it)
        except BaseException:
            self._watchdog.unwatch(self._key)
            raise
        self._watchdog.touch(self._key)
        return item


Decode = Callable[[bytes], Any] | None


def _decode(decode: Decode, raw: Any) -> Any:
    """The request message from its bytes; ValueError when they are not one."""
    if decode is None:
        return raw
    try:
        return decode(raw)
    except Exception as exc:  # noqa: BLE001 — protobuf's DecodeError and friends
        raise ValueError(f"request could not be decoded: {type(exc).__name__}") from None


class _DecodedStream:
    """A raw request stream decoded message by message (ValueError on a bad one, which the
    servicer's error mapping turns into INVALID_ARGUMENT)."""

    def __init__(self, it: Iterator[Any], decode: Decode) -> None:
        self._it = it
        self._decode = decode

    def __iter__(self) -> _DecodedStream:
        return self

    def __next__(self) -> Any:
        return _decode(self._decode, next(self._it))


class LimitsInterceptor(grpc.ServerInterceptor):
    """Counts in-flight calls (health/reflection excluded); past ``limit`` a call is refused
    with RESOURCE_EXHAUSTED before its handler runs. Client streams get the idle watchdog."""

    def __init__(self, limit: int, watchdog: IdleWatchdog) -> None:
        self.limit = limit
        self.watchdog = watchdog
        self._lock = threading.Lock()
        self.in_flight = 0
        self.num_refused = 0
        """Calls refused for the concurrency limit."""

    def _enter(self) -> bool:
        with self._lock:
            if self.in_flight >= self.limit:
                self.num_refused += 1
                return False
            self.in_flight += 1
            return True

    def _exit(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _refuse(self, context: grpc.ServicerContext) -> None:
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"server.max_concurrent_rpcs={self.limit} reached; retry later",
        )

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or is_exempt(method):
            return handler
        decode = handler.request_deserializer
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(handler.stream_stream, method, True, decode),
                None,
                handler.response_serializer,
            )
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_stream(handler.stream_unary, method, False, decode),
                None,
                handler.response_serializer,
            )
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_response_stream(handler.unary_stream, decode),
                None,
                handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            self._wrap_unary(handler.unary_unary, decode),
            None,
            handler.response_serializer,
        )

    def _wrap_unary(self, behavior: Callable[..., Any], decode: Decode) -> Callable[..., Any]:
        def unary(raw: Any, context: grpc.ServicerContext) -> Any:
            try:
                request = _decode(decode, raw)
            except ValueError as exc:
                return context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            if not self._enter():
                return self._refuse(context)
            try:
                return behavior(request, context)
            finally:
                self._exit()

        return unary

    def _wrap_response_stream(
        self, behavior: Callable[..., Any], decode: Decode
    ) -> Callable[..., Any]:
        def response_stream(raw: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                request = _decode(decode, raw)
            except ValueError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                return
            if not self._enter():
                self._refuse(context)
                return
            try:
                yield from behavior(request, context)
            finally:
                self._exit()

        return response_stream

    def _wrap_stream(
        self, behavior: Callable[..., Any], method: str, response_streaming: bool, decode: Decode
    ) -> Callable[..., Any]:
        if response_streaming:

            def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                if not self._enter():
                    self._refuse(context)
                    return
                key = self.watchdog.watch(context, method)
                try:
                    stream = _DecodedStream(_WatchedStream(requests, self.watchdog, key), decode)
                    yield from behavior(stream, context)
                finally:
                    self.watchdog.unwatch(key)
                    self._exit()

            return stream_stream

        def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            if not self._enter():
                return self._refuse(context)
            key = self.watchdog.watch(context, method)
            try:
                stream = _DecodedStream(_WatchedStream(requests, self.watchdog, key), decode)
                return behavior(stream, context)
            finally:
                self.watchdog.unwatch(key)
                self._exit()

        return stream_unary
