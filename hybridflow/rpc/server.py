"""Builds and runs a gRPC server the same way for every service.

Health checking, reflection, size limits, TLS / mutual TLS, the shared-token interceptor (or,
with no token, refusal of state-changing RPCs), a concurrency limit with immediate load
shedding, an idle timeout on client streams, loopback bind by default, graceful drain on
SIGTERM/SIGINT, a Prometheus endpoint when server.metrics_port is set. Knows nothing of what
it serves.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hybridflow.rpc.auth import NoTokenInterceptor, TokenAuthInterceptor
from hybridflow.rpc.config import ServerConfig, remote_exposure_problem
from hybridflow.rpc.limits import IdleWatchdog, LimitsInterceptor
from hybridflow.rpc.metrics import MetricsInterceptor, ServiceMetrics, service_label
from hybridflow.rpc.token import resolve_token

log = logging.getLogger(__name__)


@dataclass
class RunningServer:
    """A started server, its bound address and its health servicer."""

    server: grpc.Server
    address: str
    port: int
    health: health.HealthServicer
    service_names: tuple[str, ...]
    limits: LimitsInterceptor | None = None
    metrics: ServiceMetrics | None = None
    """The Prometheus series (None: server.metrics_port is off); services add gauges."""
    metrics_port: int = 0
    """The bound port of the Prometheus endpoint (0: off)."""

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            self.health.set(name, status)

    def stop(self, grace_s: float) -> None:
        """Marks NOT_SERVING, lets in-flight calls finish for grace_s, then stops."""
        self.set_serving(False)
        self.server.stop(grace_s).wait()
        if self.limits is not None:
            self.limits.watchdog.close()
        if self.metrics is not None:
            self.metrics.close()


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


def start_server(
    config: ServerConfig,
    register: Callable[[grpc.Server], None],
    service_names: Sequence[str],
) -> RunningServer:
    """Creates the server, lets ``register`` add servicers, binds and starts it."""
    config.validate()
    names = tuple(service_names)
    interceptors: list[grpc.ServerInterceptor] = []
    metrics = ServiceMetrics(service_label(names[0])) if config.metrics_port else None
    if metrics is not None:  # outermost: refused calls count too
        interceptors.append(MetricsInterceptor(metrics))
    token = resolve_token(config.auth_token_env, config.auth_token_file)
    problem = remote_exposure_problem(config, token)
    if problem:
        raise ValueError(problem)
    if token:
        interceptors.append(TokenAuthInterceptor(token))
    elif not config.allow_unauthenticated:
        interceptors.append(NoTokenInterceptor())
    else:
        log.warning("server.allow_unauthenticated: state-changing RPCs are open to anyone")
    limit = config.concurrency_limit
    limits = LimitsInterceptor(limit, IdleWatchdog(config.stream_idle_timeout_s))
    interceptors.append(limits)
    if metrics is not None:
        metrics.gauge(
            "hybridflow_rpc_in_flight",
            "Calls being served (the queue: calls beyond the limit are refused, not queued)",
            lambda: limits.in_flight,
        )
    # Threads beyond the limit answer health checks and refusals while the limit is reached.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=limit + config.reserved_workers),
        options=server_options(config.max_message_bytes),
        interceptors=interceptors,
    )
    register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    bind = f"{config.host}:{config.port}"
    if config.tls_cert:
        creds = grpc.ssl_server_credentials(
            [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())],
            root_certificates=Path(config.tls_client_ca).read_bytes()
            if config.tls_client_ca
            else None,
            require_client_auth=bool(config.tls_client_ca),
        )
        port = server.add_secure_port(bind, creds)
    else:
        port = server.add_insecure_port(bind)
    if port == 0:
        raise RuntimeError(f"could not bind {bind}")
    server.start()
    running = RunningServer(
        server, f"{config.reachable_host}:{port}", port, health_servicer, names, limits
    )
    if metrics is not None and config.metrics_port:
        running.metrics = metrics
        try:
            running.metrics_port = metrics.serve(config.host, config.metrics_port)
        except OSError as exc:
            server.stop(0)
            raise RuntimeError(
                f"server.metrics_port: could not bind {config.host}:{config.metrics_port}: {exc}"
            ) from exc
        log.info("Prometheus metrics on %s:%d/metrics", config.host, running.metrics_port)
    running.set_serving(True)
    log.info("serving %s on %s", ", ".join(names), running.address)
    return running


def write_port_file(path: str | Path, address: str) -> None:
    """Atomically writes the bound address for launchers waiting on it."""
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(address + "\n")
    tmp.replace(target)


def serve_until_signal(
    running: RunningServer,
    grace_s: float,
    on_stop: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Blocks until SIGTERM/SIGINT (or ``stop`` is set: the service cannot serve any more),
    then drains and stops."""
    stop = stop or threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("signal %d: draining", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    while not stop.wait(0.5):
        pass
    running.stop(grace_s)
    if on_stop is not None:
        on_stop()
    log.info("stopped")
