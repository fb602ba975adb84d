"""The reward service on a real socket: scoring, per-item errors, bad input, limits, auth,
health, reflection, and the process lifecycle (start → serve → SIGTERM drain → exit)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from hybridflow.rpc.channel import make_channel, wait_healthy
from hybridflow.rpc.config import ChannelConfig, ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.services.reward.client import GrpcRewardClient
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.services.reward.servicer import SERVICE_NAME, RewardServicer
from hybridflow.types import ScoreItem
from hybridflow.v1 import common_pb2, reward_pb2, reward_pb2_grpc
from tests.helpers import wait_for_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MIB = 1024 * 1024


def serve(server_cfg: ServerConfig | None = None):
    cfg = RewardConfig(
        scorers={
            "nan": f"{FIXTURES / 'user_scorers.py'}:returns_nan",
            "boom": f"{FIXTURES / 'user_scorers.py'}:always_raises",
        }
    )
    servicer = RewardServicer(RewardScorer(cfg))
    return start_server(
        server_cfg or ServerConfig(max_message_bytes=MIB),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )


@pytest.fixture
def reward_server():
    running = serve()
    yield running
    running.stop(0)


def test_scores_batch_and_isolates_bad_items(reward_server):
    client = GrpcRewardClient(reward_server.address)
    results = client.score_batch(
        [
            ScoreItem("arith", "7", "7"),
            ScoreItem("arith", "8", "7"),
            ScoreItem("arith", "7", None),  # missing ground truth
            ScoreItem("nan", "x", "1"),  # NaN reward
            ScoreItem("boom", "x", "1"),  # scorer exception
            ScoreItem("nosuch", "x", "1"),  # unknown data_source
            ScoreItem("openai/gsm8k", "so #### 1,234", "1234"),
        ]
    )
    assert [r.score for r in results] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    errors = [r.error for r in results]
    assert errors[0] is None and errors[1] is None and errors[6] is None
    assert "needs a ground truth" in errors[2]
    assert "non-finite" in errors[3]
    assert "RuntimeError" in errors[4]
    assert "unknown data_source 'nosuch'" in errors[5]
    # The service still serves after all that.
    assert client.score_batch([ScoreItem("arith", "3", "3")])[0].score == 1.0
    client.close()


def test_malformed_request_is_invalid_argument_naming_the_field(reward_server):
    stub = reward_pb2_grpc.RewardServiceStub(make_channel(reward_server.address))
    bad = reward_pb2.ScoreRequest(
        items=[reward_pb2.ScoreItem(data_source="arith", extra_info_json="{oops")]
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(bad, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "items[0].extra_info_json" in err.value.details()
    ok = stub.Score(
        reward_pb2.ScoreRequest(
            items=[
                reward_pb2.ScoreItem(
                    data_source="arith", response="1", has_ground_truth=True, ground_truth="1"
                )
            ]
        ),
        timeout=10,
    )
    assert ok.results[0].score == 1.0


def test_oversize_message_is_rejected_and_service_survives(reward_server):
    client = GrpcRewardClient(reward_server.address, ChannelConfig(max_message_bytes=8 * MIB))
    with pytest.raises(grpc.RpcError) as err:
        client.score_batch([ScoreItem("arith", "1" * (2 * MIB), "1")])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.score_batch([ScoreItem("arith", "1", "1")])[0].score == 1.0


def test_health_and_reflection(reward_server):
    channel = make_channel(reward_server.address)
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert SERVICE_NAME in names and "grpc.health.v1.Health" in names


def test_shared_token_auth(monkeypatch):
    monkeypatch.setenv("HF_TEST_TOKEN", "s3cret")
    running = serve(ServerConfig(auth_token_env="HF_TEST_TOKEN"))
    try:
        good = GrpcRewardClient(running.address, ChannelConfig(auth_token_env="HF_TEST_TOKEN"))
        assert good.score_batch([ScoreItem("arith", "1", "1")])[0].score == 1.0
        bad = GrpcRewardClient(running.address, ChannelConfig(auth_token_env="HF_NO_SUCH_VAR"))
        with pytest.raises(grpc.RpcError) as err:
            bad.score_batch([ScoreItem("arith", "1", "1")])
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        wait_healthy(running.address, 5)  # health stays open for probes
    finally:
        running.stop(0)


def test_service_process_lifecycle(tmp_path):
    port_file = tmp_path / "reward.addr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridflow.main.reward", "--port-file", str(port_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_file(port_file, proc)
        address = port_file.read_text().strip()
        assert address.startswith("127.0.0.1:")
        wait_healthy(address, 30)
        client = GrpcRewardClient(address)
        assert client.score_batch([ScoreItem("arith", "4", "4")])[0].score == 1.0
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert b"stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_service_process_with_a_reward_model_component(tmp_path, tiny_rm_path):
    """Started with a rule + builtin:tiny-rm config, the process answers Score with both
    component scores and their weighted sum, and GetInfo names the components."""
    config = tmp_path / "job.yaml"
    config.write_text(
        "reward:\n"
        "  components:\n"
        "    - {name: rule, kind: rule, weight: 0.5}\n"
        "    - {name: rm, kind: model, model: 'builtin:tiny-rm', weight: 0.5, batch_size: 4}\n"
    )
    port_file = tmp_path / "reward.addr"
    env = dict(os.environ, HYBRIDFLOW_HOME=str(tiny_rm_path.parent.parent))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridflow.main.reward", "--config", str(config)]
        + ["--port-file", str(port_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_for_file(port_file, proc)
        address = port_file.read_text().strip()
        wait_healthy(address, 60)
        client = GrpcRewardClient(address)
        right, wrong = client.score_batch(
            [ScoreItem("arith", "7", "7", "3+4="), ScoreItem("arith", "9", "7", "3+4=")]
        )
        client.close()
        assert right.error is None and wrong.error is None
        assert (right.components["rule"], wrong.components["rule"]) == (1.0, 0.0)
        assert right.components["rm"] > wrong.components["rm"]
        for result in (right, wrong):
            expected = 0.5 * result.components["rule"] + 0.5 * result.components["rm"]
            assert result.score == pytest.approx(expected)
        stub = reward_pb2_grpc.RewardServiceStub(make_channel(address))
        info = stub.GetInfo(common_pb2.Empty(), timeout=10)
        assert list(info.components) == ["rule", "rm"] and info.num_scored == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
