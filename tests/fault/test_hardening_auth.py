"""Finding 4 (auth part) and TLS through the launcher's health check.

With no token configured, state-changing RPCs are refused (UNAUTHENTICATED, naming
HYBRIDFLOW_TOKEN) unless server.allow_unauthenticated is set; a per-run token file (0600,
O_EXCL) works for servers and clients; wait_healthy takes the ChannelConfig so a TLS server
becomes healthy through it.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest

from hybridflow.rpc.auth import is_state_changing
from hybridflow.rpc.channel import check_health, make_channel, wait_healthy
from hybridflow.rpc.config import ChannelConfig, ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.rpc.token import create_token_file, read_token_file
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.services.reward.servicer import SERVICE_NAME as REWARD_SERVICE
from hybridflow.services.reward.servicer import RewardServicer
from hybridflow.v1 import common_pb2, reward_pb2, reward_pb2_grpc, weight_sync_pb2_grpc
from hybridflow.weights.servicer import SERVICE_NAME as WEIGHT_SYNC_SERVICE
from hybridflow.weights.servicer import WeightSyncServicer
from tests.helpers import self_signed_cert


def _start_weight_sync_server(rollout: object, config: ServerConfig):  # noqa: ANN202
    servicer = WeightSyncServicer(rollout, 64 * 1024 * 1024)  # type: ignore[arg-type]
    return start_server(
        config,
        lambda s: weight_sync_pb2_grpc.add_WeightSyncServiceServicer_to_server(servicer, s),
        [WEIGHT_SYNC_SERVICE],
    )


@pytest.fixture(scope="module")
def rollout(tiny_model_path: Path) -> object:
    from hybridflow.services.rollout.engine import HFEngine
    from hybridflow.services.rollout.local import LocalRollout

    return LocalRollout(HFEngine(tiny_model_path), "tiny")


def test_state_changing_methods_cover_every_mutating_rpc():
    for method in (
        "/hybridflow.v1.LearnerService/TrainStep",
        "/hybridflow.v1.LearnerService/PublishWeights",
        "/hybridflow.v1.LearnerService/SaveCheckpoint",
        "/hybridflow.v1.WeightSyncService/UpdateWeights",
        "/hybridflow.v1.WeightSyncService/JoinWeightSync",
        "/hybridflow.v1.WeightSyncService/ReceiveWeights",
        "/hybridflow.v1.CoordinatorService/Pause",
        "/hybridflow.v1.CoordinatorService/Resume",
        "/hybridflow.v1.CoordinatorService/Stop",
    ):
        assert is_state_changing(method), method
    for method in (
        "/hybridflow.v1.RolloutService/Generate",
        "/hybridflow.v1.LearnerService/GetInfo",
        "/hybridflow.v1.WeightSyncService/Describe",
        "/grpc.health.v1.Health/Check",
    ):
        assert not is_state_changing(method), method


def test_no_token_refuses_state_changing_rpcs(rollout, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    running = _start_weight_sync_server(rollout, ServerConfig())
    channel = make_channel(running.address, ChannelConfig(retries=2))
    try:
        stub = weight_sync_pb2_grpc.WeightSyncServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.UpdateWeights(iter([common_pb2.WeightChunk()]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "HYBRIDFLOW_TOKEN" in err.value.details()
        assert "UpdateWeights" in err.value.details()
        # Read-only RPCs and health stay open.
        assert stub.Describe(common_pb2.Empty(), timeout=10).tensor_parallel_size == 1
        assert check_health(channel)
    finally:
        channel.close()
        running.stop(0)


def test_allow_unauthenticated_opens_state_changing_rpcs(rollout, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    running = _start_weight_sync_server(rollout, ServerConfig(allow_unauthenticated=True))
    channel = make_channel(running.address)
    try:
        stub = weight_sync_pb2_grpc.WeightSyncServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:  # reaches the servicer: a bad stream
            stub.UpdateWeights(iter([common_pb2.WeightChunk()]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
        running.stop(0)


def test_token_file_is_private_exclusive_and_authenticates(rollout, tmp_path, monkeypatch):
    path = create_token_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(read_token_file(path)) >= 32
    with pytest.raises(FileExistsError):
        create_token_file(tmp_path)  # never reused or followed
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    running = _start_weight_sync_server(rollout, ServerConfig(auth_token_file=str(path)))
    good = make_channel(running.address, ChannelConfig(auth_token_file=str(path)))
    bad = make_channel(running.address, ChannelConfig(retries=2))
    try:
        info = weight_sync_pb2_grpc.WeightSyncServiceStub(good).Describe(
            common_pb2.Empty(), timeout=10
        )
        assert info.tensor_parallel_size == 1
        with pytest.raises(grpc.RpcError) as err:
            weight_sync_pb2_grpc.WeightSyncServiceStub(bad).Describe(common_pb2.Empty(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        good.close()
        bad.close()
        running.stop(0)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path)


def test_wait_healthy_and_calls_over_tls(tmp_path):
    cert, key = _self_signed(tmp_path)
    servicer = RewardServicer(RewardScorer(RewardConfig()))
    running = start_server(
        ServerConfig(tls_cert=str(cert), tls_key=str(key)),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        [REWARD_SERVICE],
    )
    tls = ChannelConfig(tls_ca=str(cert))
    try:
        wait_healthy(running.address, 10, config=tls)
        assert check_health(running.address, timeout_s=5, config=tls)
        assert not check_health(running.address, timeout_s=1)  # a plaintext probe never is
        channel = make_channel(running.address, tls)
        info = reward_pb2_grpc.RewardServiceStub(channel).GetInfo(common_pb2.Empty(), timeout=10)
        assert isinstance(info, reward_pb2.RewardInfo) and info.scorers
        channel.close()
    finally:
        running.stop(0)


def test_export_run_token_creates_reuses_and_respects_an_operator_token(tmp_path):
    from hybridflow.rpc.token import TOKEN_FILE_NAME, export_run_token

    env: dict[str, str] = {}
    path = export_run_token(tmp_path, env)
    assert path == tmp_path / TOKEN_FILE_NAME and env["HYBRIDFLOW_TOKEN"] == read_token_file(path)
    resumed: dict[str, str] = {}
    assert export_run_token(tmp_path, resumed) == path  # a resumed run shares the token
    assert resumed == env
    own = {"HYBRIDFLOW_TOKEN": "operator"}
    assert (
        export_run_token(tmp_path / "other", own) is None and own["HYBRIDFLOW_TOKEN"] == "operator"
    )
    path.chmod(0o644)
    with pytest.raises(ValueError, match="private"):
        export_run_token(tmp_path, {})
