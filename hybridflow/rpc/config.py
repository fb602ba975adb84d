"""Server and client transport settings shared by every service (no grpc import here)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.ranges import above, at_least, raise_problems, within

MIB = 1024 * 1024


@dataclass
class ServerConfig:
    """Where and how a service listens."""

    host: str = "127.0.0.1"
    """Bind address; loopback unless set (0.0.0.0 or the host's address on a cluster: then
    TLS and a token are required, see ``allow_insecure_remote``)."""
    port: int = 0
    """TCP port; 0 lets the OS pick one (written to --port-file)."""
    advertise_host: str = ""
    """The address other hosts reach this service at, written to --port-file (what the
    launcher hands the coordinator). Empty: ``host``, or this machine's host name when
    ``host`` is a wildcard (0.0.0.0, ::)."""
    max_message_bytes: int = 256 * MIB
    """Largest message received or sent."""
    max_workers: int = 8
    """Threads serving RPCs."""
    grace_s: float = 10.0
    """On SIGTERM: seconds in-flight RPCs get to finish."""
    tls_cert: str = ""
    """PEM certificate; with tls_key enables TLS."""
    tls_key: str = ""
    """PEM private key of tls_cert."""
    tls_client_ca: str = ""
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""
    auth_token_env: str = "HYBRIDFLOW_TOKEN"
    """Environment variable holding a shared token; when it is set, every call but health and
    reflection must carry it."""
    auth_token_file: str = ""
    """File holding the shared token (e.g. the launcher's 0600 per-run file); used when the
    environment variable is unset or empty."""
    allow_unauthenticated: bool = False
    """With no token configured, state-changing RPCs (train, publish/update weights,
    checkpoints, pause/resume/stop) are refused unless this is true. Only for a trusted
    sandbox: anyone who can reach the port can then steer the service."""
    allow_insecure_remote: bool = False
    """Off loopback the service refuses to start without TLS (tls_cert/tls_key) and a token
    (the environment variable or auth_token_file): anyone who reaches the port could
    otherwise read or steer it. True only on a network you trust completely."""
    max_concurrent_rpcs: int = 0
    """Calls served at once (health and reflection excluded); one more is refused with
    RESOURCE_EXHAUSTED at once instead of queueing. 0: max_workers."""
    reserved_workers: int = 2
    """Threads beyond max_concurrent_rpcs, so health checks and refusals are always answered."""
    metrics_port: int | None = None
    """Port of this service's Prometheus endpoint (GET /metrics, on server.host): calls and
    errors by method, latency histograms, calls in flight, the service's own gauges. None or
    0: off (the default on CPU runs); the Kubernetes manifests turn it on. A rollout replica
    adds its replica index, as it does to server.port."""
    stream_idle_timeout_s: float = 30.0
    """A client stream (TrainStep, UpdateWeights) that sends nothing for this long is
    cancelled, so a stalled client cannot hold a worker thread forever."""

    @property
    def reachable_host(self) -> str:
        """What --port-file advertises (see ``advertise_host``)."""
        if self.advertise_host:
            return self.advertise_host
        if self.host in ("0.0.0.0", "::", "[::]", ""):
            import socket

            return socket.gethostname()
        return self.host

    @property
    def is_loopback(self) -> bool:
        """Whether ``host`` binds only the loopback interface."""
        return is_loopback_host(self.host)

    @property
    def concurrency_limit(self) -> int:
        """The effective max_concurrent_rpcs."""
        return self.max_concurrent_rpcs or self.max_workers

    def validate(self) -> None:
        raise_problems(
            [
                within("server.port", self.port, 0, 65535),
                at_least("server.max_message_bytes", self.max_message_bytes, MIB),
                within("server.max_workers", self.max_workers, 1, 1024),
                at_least("server.grace_s", self.grace_s, 0),
                None
                if self.metrics_port is None
                else within("server.metrics_port", self.metrics_port, 0, 65535),
                "server.metrics_port: must differ from server.port"
                if self.metrics_port and self.metrics_port == self.port
                else None,
            ]
        )
        if not 0 <= self.port < 65536:
            raise ValueError(f"server.port must be in [0, 65535], got {self.port}")
        if self.max_message_bytes < MIB:
            raise ValueError("server.max_message_bytes must be at least 1 MiB")
        if self.max_workers < 1:
            raise ValueError(f"server.max_workers must be >= 1, got {self.max_workers}")
        if self.max_concurrent_rpcs < 0:
            raise ValueError(
                f"server.max_concurrent_rpcs must be >= 0, got {self.max_concurrent_rpcs}"
            )
        if self.reserved_workers < 1:
            raise ValueError(f"server.reserved_workers must be >= 1, got {self.reserved_workers}")
        if not self.stream_idle_timeout_s > 0:
            raise ValueError(
                f"server.stream_idle_timeout_s must be > 0, got {self.stream_idle_timeout_s}"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("server.tls_cert and server.tls_key must be set together")


@dataclass
class ChannelConfig:
    """How a client connects to a service."""

    max_message_bytes: int = 256 * MIB
    """Largest message sent or received."""
    timeout_s: float = 120.0
    """Deadline of each call."""
    retries: int = 5
    """Attempts for calls that fail with UNAVAILABLE."""
    initial_backoff_s: float = 0.2
    """First retry delay; doubles each attempt."""
    chunk_bytes: int = 1 * MIB
    """Chunk size when streaming large payloads."""
    tls_ca: str = ""
    """PEM CA bundle to verify the server; enables TLS."""
    tls_cert: str = ""
    """PEM client certificate (mutual TLS)."""
    tls_key: str = ""
    """PEM key of tls_cert."""
    auth_token_env: str = "HYBRIDFLOW_TOKEN"
    """Environment variable holding the shared token sent with every call (if set)."""
    auth_token_file: str = ""
    """File holding the shared token; used when the environment variable is unset or empty."""

    def validate(self) -> None:
        raise_problems(
            [
                at_least("channel.max_message_bytes", self.max_message_bytes, MIB),
                above("channel.timeout_s", self.timeout_s, 0),
                within("channel.retries", self.retries, 0, 100),
                at_least("channel.initial_backoff_s", self.initial_backoff_s, 0),
                within("channel.chunk_bytes", self.chunk_bytes, 64 * 1024, 4 * MIB),
            ]
        )
        if self.timeout_s <= 0:
            raise ValueError("channel.timeout_s must be > 0")
        if not 64 * 1024 <= self.chunk_bytes <= 4 * MIB:
            raise ValueError("channel.chunk_bytes must be between 64 KiB and 4 MiB")


def is_loopback_host(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (a name other than localhost is not trusted to be)."""
    import ipaddress

    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def remote_exposure_problem(config: ServerConfig, token: str, key: str = "server") -> str | None:
    """Why a server config may not listen off loopback (None: it may): TLS and a token are
    required there unless ``allow_insecure_remote``."""
    if config.is_loopback or config.allow_insecure_remote:
        return None
    missing = [
        what
        for what, ok in (
            (f"TLS ({key}.tls_cert and {key}.tls_key)", bool(config.tls_cert and config.tls_key)),
            (
                f"a token (${config.auth_token_env} or {key}.auth_token_file)",
                bool(token),
            ),
        )
        if not ok
    ]
    if not missing:
        return None
    return (
        f"{key}.host={config.host} listens off loopback without {' and '.join(missing)}: set "
        f"them (or {key}.allow_insecure_remote: true on a network you trust completely)"
    )
