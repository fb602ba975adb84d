"""Finding 7: an unauthenticated PublishWeights made the learner connect to any host:port and
hold its lock (ComputeLogProbs timed out for 40 s and more); UpdateWeights accepted NaN weights
under any version. Finding 8: the weight-sync TCPStore listened on all interfaces."""

from __future__ import annotations

import socket
import time

import grpc
import psutil
import pytest
import torch

from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.codec import pack_tokens
from hybridflow.types import SamplingParams
from hybridflow.v1 import learner_pb2, learner_pb2_grpc
from hybridflow.weights.client import GrpcWeightSyncClient
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.dist_formation import listen_socket
from hybridflow.weights.transport.group import init_weight_sync_group
from tests.helpers import start_learner_server, start_rollout_server


@pytest.fixture(scope="module")
def replica(tiny_model_path):  # noqa: ANN201
    server, rollout = start_rollout_server(tiny_model_path)
    client = GrpcWeightSyncClient(server.address)
    yield rollout, client
    client.close()
    server.stop(0)


def _weights(rollout, scale: float = 1.0) -> list[tuple[str, torch.Tensor]]:  # noqa: ANN001
    return [(n, t.detach().clone() * scale) for n, t in rollout.engine.model.state_dict().items()]


def test_update_weights_rejects_non_finite_tensors(replica):
    rollout, client = replica
    before = rollout.policy_version
    weights = _weights(rollout)
    name, tensor = weights[-1]
    original = tensor.clone()
    tensor.view(-1)[0] = float("nan")
    with pytest.raises(grpc.RpcError) as err:
        client.send(weights, before + 1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert name in err.value.details() and "non-finite" in err.value.details()
    # Nothing was applied: same version, same values, generation still works.
    assert rollout.policy_version == before
    assert rollout.pending_version is None
    assert torch.equal(rollout.engine.model.state_dict()[name], original)
    groups = rollout.generate([[5, 6]], SamplingParams(max_new_tokens=2))
    assert all(lp == lp for c in groups[0] for lp in c.logprobs)  # no NaN log-probs


def test_update_weights_rejects_versions_that_go_backwards(replica):
    rollout, client = replica
    current = rollout.policy_version
    assert client.send(_weights(rollout), current + 5).policy_version == current + 5
    with pytest.raises(grpc.RpcError) as err:
        client.send(_weights(rollout), current + 3)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(current + 3) in err.value.details() and str(current + 5) in err.value.details()
    assert rollout.policy_version == current + 5
    # The same version again is a re-sync, allowed.
    assert client.send(_weights(rollout), current + 5).policy_version == current + 5


@pytest.fixture(scope="module")
def learner(tiny_model_path):  # noqa: ANN201
    config = WeightSyncConfig(transport="grpc", connect_timeout_s=1.0)
    server, _ = start_learner_server(tiny_model_path, weight_sync=config)
    channel = make_channel(server.address)
    yield learner_pb2_grpc.LearnerServiceStub(channel)
    channel.close()
    server.stop(0)


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("10.1.2.3:5000", "weight_sync.allowed_hosts"),
        ("example.com:443", "weight_sync.allowed_hosts"),
        ("127.0.0.1", "host:port"),
        ("127.0.0.1:99999", "host:port"),
    ],
)
def test_publish_weights_refuses_targets_off_the_allowed_hosts(learner, target, words):
    with pytest.raises(grpc.RpcError) as err:
        learner.PublishWeights(learner_pb2.PublishWeightsRequest(targets=[target]), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in err.value.details()


def test_publish_to_a_silent_target_fails_fast_and_frees_the_learner(learner):
    # A port that accepts TCP connections and never speaks: the finding's unreachable target.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.perf_counter()
        with pytest.raises(grpc.RpcError) as err:
            learner.PublishWeights(learner_pb2.PublishWeightsRequest(targets=[target]), timeout=60)
        print(f"publish to a silent target failed after {time.perf_counter() - start:.2f} s")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert target in err.value.details() and "weight_sync.connect_timeout_s" in err.value.details()
    reply = learner.ComputeLogProbs(
        learner_pb2.ComputeLogProbsRequest(
            prompts=pack_tokens([[5, 6]]), responses=pack_tokens([[7]]), temperature=1.0
        ),
        timeout=30,
    )
    assert len(reply.logprobs.data) == 4


def test_weight_sync_store_listens_on_the_configured_host_only():
    sock = listen_socket("127.0.0.1")
    port = sock.getsockname()[1]
    group = init_weight_sync_group(
        "127.0.0.1", port, 1, 0, "gloo", 30.0, group_name="t", listen_fd=sock.detach()
    )
    try:
        listening = [
            c.laddr
            for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    finally:
        group.close()


def test_store_socket_of_an_unknown_host_is_an_error():
    with pytest.raises(OSError):
        listen_socket("203.0.113.7")  # TEST-NET-3: not an address of this machine
