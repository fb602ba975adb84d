"""Server and client transport settings shared by every service (no grpc import here)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems

MIB = 1024 * 1024


@dataclass
class ServerConfig:
    """Where and how a service listens."""

    host: str = knob("127.0.0.1", free="a bind address, checked when the server binds")
    """Bind address; loopback unless set (0.0.0.0 or the host's address on a cluster: then
    TLS and a token are required, see ``allow_insecure_remote``)."""
    port: int = knob(0, ge=0, le=65535)
    """TCP port; 0 lets the OS pick one (written to --port-file)."""
    advertise_host: str = knob("", free="a host name other hosts resolve")
    """The address other hosts reach this service at, written to --port-file (what the
    launcher hands the coordinator). Empty: ``host``, or this machine's host name when
    ``host`` is a wildcard (0.0.0.0, ::)."""
    max_message_bytes: int = knob(256 * MIB, ge=MIB)
    """Largest message received or sent."""
    max_workers: int = knob(8, ge=1, le=1024)
    """Threads serving RPCs."""
    grace_s: float = knob(10.0, ge=0)
    """On SIGTERM: seconds in-flight RPCs get to finish."""
    tls_cert: str = knob("", free="a file path, read when the server starts")
    """PEM certificate; with tls_key enables TLS."""
    tls_key: str = knob("", free="a file path, read when the server starts")
    """PEM private key of tls_cert."""
    tls_client_ca: str = knob("", free="a file path, read when the server starts")
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""
    auth_token_env: str = knob("HYBRIDFLOW_TOKEN", free="an environment variable's name")
    """Environment variable holding a shared token; when it is set, every call but health and
    reflection must carry it."""
    auth_token_file: str = knob("", free="a file path, read when the server starts")
    """File holding the shared token (e.g. the launcher's 0600 per-run file); used when the
    environment variable is unset or empty."""
    allow_unauthenticated: bool = False
    """With no token configured, state-changing RPCs (train, publish/update weights,
    checkpoints, pause/resume/stop, environment episodes) are refused unless this is true. Only for a trusted
    sandbox: anyone who can reach the port can then steer the service."""
    allow_insecure_remote: bool = False
    """Off loopback the service refuses to start without TLS (tls_cert/tls_key) and a token
    (the environment variable or auth_token_file): anyone who reaches the port could
    otherwise read or steer it. True only on a network you trust completely."""
    max_concurrent_rpcs: int = knob(0, ge=0)
    """Calls served at once (health and reflection excluded); one more is refused with
    RESOURCE_EXHAUSTED at once instead of queueing. 0: max_workers."""
    reserved_workers: int = knob(2, ge=1)
    """Threads beyond max_concurrent_rpcs, so health checks and refusals are always answered."""
    metrics_port: int | None = knob(None, ge=0, le=65535)
    """Port of this service's Prometheus endpoint (GET /metrics, on server.host): calls and
    errors by method, latency histograms, calls in flight, the service's own gauges. None or
    0: off (the default on CPU runs); the Kubernetes manifests turn it on. A rollout replica
    adds its replica index, as it does to server.port."""
    stream_idle_timeout_s: float = knob(30.0, gt=0)
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
        """Each field's bound, plus: metrics on another port than the RPCs, and the TLS
        certificate and key set together."""
        raise_problems(
            [
                *field_problems(self, "server"),
                "server.metrics_port: must differ from server.port"
                if self.metrics_port and self.metrics_port == self.port
                else None,
                "server.tls_cert and server.tls_key must be set together"
                if bool(self.tls_cert) != bool(self.tls_key)
                else None,
            ]
        )


@dataclass
class ChannelConfig:
    """How a client connects to a service."""

    max_message_bytes: int = knob(256 * MIB, ge=MIB)
    """Largest message sent or received."""
    timeout_s: float = knob(120.0, gt=0)
    """Deadline of each call."""
    retries: int = knob(5, ge=0, le=100)
    """Attempts for calls that fail with UNAVAILABLE."""
    initial_backoff_s: float = knob(0.2, ge=0)
    """First retry delay; doubles each attempt."""
    chunk_bytes: int = knob(1 * MIB, ge=64 * 1024, le=4 * MIB)
    """Chunk size when streaming large payloads."""
    tls_ca: str = knob("", free="a file path, read when the channel opens")
    """PEM CA bundle to verify the server; enables TLS."""
    tls_cert: str = knob("", free="a file path, read when the channel opens")
    """PEM client certificate (mutual TLS)."""
    tls_key: str = knob("", free="a file path, read when the channel opens")
    """PEM key of tls_cert."""
    auth_token_env: str = knob("HYBRIDFLOW_TOKEN", free="an environment variable's name")
    """Environment variable holding the shared token sent with every call (if set)."""
    auth_token_file: str = knob("", free="a file path, read when the channel opens")
    """File holding the shared token; used when the environment variable is unset or empty."""

    def validate(self) -> None:
        """Each field's bound (no checks between fields)."""
        raise_problems(field_problems(self, "channel"))


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
