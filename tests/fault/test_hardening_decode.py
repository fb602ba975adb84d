"""Undecodable requests are refused by our handlers (INVALID_ARGUMENT), never by grpcio's own
deserializer: grpcio 1.85 leaks about 20 KB per request it fails to deserialize (a bare
grpcio server grew 190 MB over 10,000 such requests), so services must not let it try."""

from __future__ import annotations

import grpc

from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server


def test_undecodable_requests_are_invalid_argument_not_grpc_deserialize_errors() -> None:
    from hybridflow.services.reward.scorers import RewardScorer
    from hybridflow.services.reward.servicer import SERVICE_NAME, RewardServicer
    from hybridflow.v1 import reward_pb2_grpc

    servicer = RewardServicer(RewardScorer())
    server = start_server(
        ServerConfig(),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    channel = make_channel(server.address)
    try:
        for method in ("Score", "GetInfo"):
            call = channel.unary_unary(f"/{SERVICE_NAME}/{method}")  # raw bytes both ways
            for _ in range(50):
                try:
                    call(b"\xff\xff\xff", timeout=10)
                    raise AssertionError("garbage was accepted")
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
                    assert "could not be decoded" in exc.details()
        assert call(b"", timeout=10) is not None  # a valid (empty) GetInfo still answers
    finally:
        channel.close()
        server.stop(0)
