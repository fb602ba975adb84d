"""A service's Prometheus endpoint (``server.metrics_port``): calls, errors and latency by
method, calls in flight, and the readings a service adds (tokens, policy version, ...).

Each server has its own CollectorRegistry, so several services in one process (tests, the
coordinator) keep their series apart. Health checks and reflection are not counted. The
exporter is prometheus_client's HTTP server on a daemon thread, closed with the gRPC server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hybridflow.rpc.auth import is_exempt

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Seconds: from a health-sized call to a multi-minute train step or weight publish."""


def service_label(service_name: str) -> str:
    """``hybridflow.v1.RewardService`` → ``reward``: the ``service`` label of every series."""
    short = service_name.rsplit(".", 1)[-1]
    return short.removesuffix("Service").lower() or short


_Family = type[GaugeMetricFamily] | type[CounterMetricFamily]


class _Readings(Collector):
    """Gauges and counters read from the service when scraped (nothing to keep in step)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.items: list[tuple[_Family, str, str, Callable[[], float]]] = []

    def collect(self) -> Iterator[Metric]:
        for kind, name, doc, read in self.items:
            family = kind(name, doc, labels=["service"])
            family.add_metric([self.service], float(read()))
            yield family


class ServiceMetrics:
    """One service's series and, once ``serve`` ran, its HTTP endpoint."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hybridflow_rpc_requests",
            "RPCs finished, by method and status code (code != OK: errors)",
            ["service", "method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hybridflow_rpc_latency_seconds",
            "Seconds from the call's arrival to its answer (streams: to the last message)",
            ["service", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._readings = _Readings(service)
        self.registry.register(self._readings)
        self._http: WSGIServer | None = None
        self._thread: Thread | None = None

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A gauge whose value ``read`` returns at each scrape."""
        self._readings.items.append((GaugeMetricFamily, name, doc, read))

    def counter(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A counter (exposed as ``name_total``) whose running total ``read`` returns."""
        self._readings.items.append((CounterMetricFamily, name, doc, read))

    def record(self, method: str, code: str, seconds: float) -> None:
        self.requests.labels(self.service, method, code).inc()
        self.latency.labels(self.service, method).observe(seconds)

    def serve(self, host: str, port: int) -> int:
        """Starts the exporter on host:port (0: any free port); returns the bound port."""
        self._http, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class MetricsInterceptor(grpc.ServerInterceptor):
    """Times every call and counts it under its final status code. Installed outermost, so
    calls refused by auth or the concurrency limit count too."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or is_exempt(method):
            return handler
        name = method.lstrip("/")
        decode, encode = handler.request_deserializer, handler.response_serializer
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._timed(handler.unary_unary, name), decode, encode
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._timed(handler.stream_unary, name), decode, encode
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._timed_stream(handler.unary_stream, name), decode, encode
            )
        return grpc.stream_stream_rpc_method_handler(
            self._timed_stream(handler.stream_stream, name), decode, encode
        )

    def _timed(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            failed = True
            try:
                response = behavior(request, context)
                failed = False
                return response
            finally:
                self.metrics.record(method, _code(context, failed), time.perf_counter() - start)

        return call

    def _timed_stream(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            start = time.perf_counter()
            failed = True
            try:
                yield from behavior(request, context)
                failed = False
            finally:
                self.metrics.record(method, _code(context, failed), time.perf_counter() - start)

        return call


def _code(context: grpc.ServicerContext, failed: bool) -> str:
    """The call's status code name: the one set (abort / set_code), else OK, or UNKNOWN when
    the handler raised without setting one (gRPC answers UNKNOWN then)."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN" if failed else "OK"
