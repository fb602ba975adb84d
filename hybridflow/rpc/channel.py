"""Client side: channels with size limits, retry on UNAVAILABLE, TLS and the shared token."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hybridflow.rpc.auth import TokenClientInterceptor
from hybridflow.rpc.config import ChannelConfig
from hybridflow.rpc.token import resolve_token


@functools.cache
def _streaming_methods() -> list[dict[str, str]]:
    """Every streaming RPC of the hybridflow.v1 services."""
    from hybridflow.v1 import (
        coordinator_pb2,
        learner_pb2,
        reward_pb2,
        rollout_pb2,
        weight_sync_pb2,
    )

    out = []
    for module in (coordinator_pb2, learner_pb2, reward_pb2, rollout_pb2, weight_sync_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.client_streaming or method.server_streaming:
                    out.append({"service": service.full_name, "method": method.name})
    return out


def _service_config(config: ChannelConfig) -> str:
    """gRPC's built-in retry policy: UNAVAILABLE is retried with exponential backoff, for
    unary calls only. A retried streaming call whose server died mid-stream was seen to hang
    until its deadline (grpcio 1.85); callers of streams handle UNAVAILABLE themselves."""
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{}],
                    "retryPolicy": {
                        "maxAttempts": max(2, min(config.retries, 5)),
                        "initialBackoff": f"{config.initial_backoff_s}s",
                        "maxBackoff": "5s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                },
                {"name": _streaming_methods()},
            ]
        }
    )


def make_channel(address: str, config: ChannelConfig | None = None) -> grpc.Channel:
    """Opens a channel to ``address`` (host:port)."""
    config = config or ChannelConfig()
    options = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.enable_retries", 1),
        # A restarted service is reachable again within ~2 s (gRPC's default backoff after a
        # refused connection grows to 120 s).
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
        ("grpc.service_config", _service_config(config)),
    ]
    if config.tls_ca:
        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(config.tls_ca).read_bytes(),
            private_key=Path(config.tls_key).read_bytes() if config.tls_key else None,
            certificate_chain=Path(config.tls_cert).read_bytes() if config.tls_cert else None,
        )
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    token = resolve_token(config.auth_token_env, config.auth_token_file)
    if token:
        channel = grpc.intercept_channel(channel, TokenClientInterceptor(token))
    return channel


def check_health(
    channel: grpc.Channel | str,
    service: str = "",
    timeout_s: float = 2.0,
    config: ChannelConfig | None = None,
) -> bool:
    """True when the server answers SERVING for ``service``. ``channel`` may be an address:
    then a channel is opened with ``config`` (TLS CA, client cert) and closed again."""
    if isinstance(channel, str):
        owned = make_channel(channel, config)
        try:
            return check_health(owned, service, timeout_s)
        finally:
            owned.close()
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_healthy(
    address: str,
    timeout_s: float = 120.0,
    service: str = "",
    config: ChannelConfig | None = None,
) -> None:
    """Polls the health service until SERVING; raises TimeoutError naming the address.

    ``config`` is the client side of the server's transport: with TLS on the server, pass a
    ChannelConfig whose ``tls_ca`` (and for mutual TLS ``tls_cert``/``tls_key``) verify it;
    a plaintext probe of a TLS server never becomes healthy."""
    deadline = time.monotonic() + timeout_s
    channel = make_channel(address, config)
    try:
        while time.monotonic() < deadline:
            if check_health(channel, service, timeout_s=min(2.0, timeout_s)):
                return
            time.sleep(0.1)  # polling a remote condition: nothing to wait on locally
    finally:
        channel.close()
    raise TimeoutError(f"{address} did not become healthy within {timeout_s:.0f}s")
