"""Server and client transport settings shared by every service (no grpc import here)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.ranges import above, at_least, raise_problems, within

MIB = 1024 * 1024


@dataclass
class ServerConfig:
    """Where and how a service listens."""

    host: str = "127.0.0.1"
    """Bind address; loopback unless set (use 0.0.0.0 on a cluster)."""
    port: int = 0
    """TCP port; 0 lets the OS pick one (written to --port-file)."""
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
    """Environment variable holding a shared token; when it is set, every call must carry it."""

    def validate(self) -> None:
        raise_problems(
            [
                within("server.port", self.port, 0, 65535),
                at_least("server.max_message_bytes", self.max_message_bytes, MIB),
                within("server.max_workers", self.max_workers, 1, 1024),
                at_least("server.grace_s", self.grace_s, 0),
            ]
        )
        if not 0 <= self.port < 65536:
            raise ValueError(f"server.port must be in [0, 65535], got {self.port}")
        if self.max_message_bytes < MIB:
            raise ValueError("server.max_message_bytes must be at least 1 MiB")
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
