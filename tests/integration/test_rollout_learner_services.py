"""Rollout and learner services on real sockets with the real tiny model: generation,
log-prob parity (rollout vs learner, ≤ 1e-4 fp32), weight push over gRPC, bad input."""

import math
import subprocess
import sys

import grpc
import pytest

from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.codec import pack_floats, pack_tokens, stream_message
from hybridflow.rpc.config import ChannelConfig
from hybridflow.services.learner import convert as learner_convert
from hybridflow.services.learner.client import GrpcLearnerClient
from hybridflow.services.rollout.client import GrpcRolloutClient
from hybridflow.types import SamplingParams, TrainSample
from hybridflow.v1 import common_pb2, learner_pb2, learner_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from tests.helpers import MIB, start_learner_server, start_rollout_server

PARITY_TOL = 1e-4


@pytest.fixture(scope="module")
def services(tiny_model_path):
    rollout_server, rollout = start_rollout_server(tiny_model_path, max_bytes=4 * MIB)
    learner_server, core = start_learner_server(
        tiny_model_path, max_bytes=4 * MIB, optimizer={"lr": 1e-3}
    )
    yield (
        GrpcRolloutClient(rollout_server.address),
        GrpcLearnerClient(learner_server.address),
        rollout_server,
        learner_server,
        rollout,
    )
    rollout_server.stop(0)
    learner_server.stop(0)


def encode(tiny_model_path, texts):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def assert_parity(rollout, learner, prompts, temperature=1.0):
    groups = rollout.generate(
        prompts, SamplingParams(temperature=temperature, n=3, max_new_tokens=6, seed=7)
    )
    flat_prompts = [p for p, g in zip(prompts, groups) for _ in g]
    responses = [c.token_ids for g in groups for c in g]
    rollout_lps = [c.logprobs for g in groups for c in g]
    learner_lps = learner.compute_logprobs(flat_prompts, responses, temperature)
    worst = max(abs(a - b) for ro, le in zip(rollout_lps, learner_lps) for a, b in zip(ro, le))
    assert worst <= PARITY_TOL, worst
    return groups


def test_generate_returns_groups_with_versions(services, tiny_model_path):
    rollout, *_ = services
    prompts = encode(tiny_model_path, ["1+2=", "3+4=", "9+9=", "0+0=", "5+1="])
    groups = rollout.generate(prompts, SamplingParams(n=4, max_new_tokens=5))
    assert len(groups) == 5 and all(len(g) == 4 for g in groups)  # streamed over 2 messages
    for c in (c for g in groups for c in g):
        assert len(c.logprobs) == len(c.token_ids) and 1 <= len(c.token_ids) <= 5
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length") and c.policy_version == 0


def test_logprob_parity_before_and_after_a_weight_push(services, tiny_model_path):
    rollout, learner, _, _, local_rollout = services
    prompts = encode(tiny_model_path, ["1+2=", "7+8=", "4+4="])
    groups = assert_parity(rollout, learner, prompts)
    assert_parity(rollout, learner, prompts, temperature=0.7)
    samples = [
        TrainSample(p, c.token_ids, c.logprobs, float(i % 2), gid, 0)
        for gid, (p, g) in enumerate(zip(prompts, groups))
        for i, c in enumerate(g)
    ]
    result = learner.train_step(samples)
    assert result.policy_version == 1 and math.isfinite(result.metrics["actor/pg_loss"])
    # The policy moved: rollout (still v0) and learner now disagree ...
    old = [c.logprobs for g in groups for c in g]
    flat_prompts = [p for p, g in zip(prompts, groups) for _ in g]
    new = learner.compute_logprobs(flat_prompts, [c.token_ids for g in groups for c in g], 1.0)
    assert max(abs(a - b) for ro, le in zip(old, new) for a, b in zip(ro, le)) > 1e-3
    # ... until the learner publishes its weights to the rollout over gRPC.
    report = learner.publish_weights([services[2].address])
    assert report.policy_version == 1 and report.num_bytes > 0
    assert rollout.status().policy_version == 1
    groups = assert_parity(rollout, learner, prompts)
    assert {c.policy_version for g in groups for c in g} == {1}


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r.prompts.CopyFrom(pack_tokens([])), "prompts"),
        (lambda r: r.prompts.CopyFrom(pack_tokens([[1, 99999]])), "99999"),
        (lambda r: setattr(r.sampling, "n", 0), "sampling.n"),
        (lambda r: setattr(r.sampling, "temperature", -1.0), "sampling.temperature"),
        (lambda r: setattr(r.sampling, "top_p", 0.0), "sampling.top_p"),
        (lambda r: setattr(r.sampling, "top_k", -1), "sampling.top_k"),
        (lambda r: r.prompts.offsets.append(7), "prompts.offsets"),
    ],
)
def test_rollout_bad_input_is_invalid_argument(services, mutate, field):
    rollout, _, rollout_server, _, _ = services
    stub = rollout_pb2_grpc.RolloutServiceStub(make_channel(rollout_server.address))
    request = rollout_pb2.GenerateRequest(
        prompts=pack_tokens([[5, 6]]),
        sampling=common_pb2.SamplingParams(temperature=1, top_p=1, max_new_tokens=2, n=1),
    )
    mutate(request)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    assert len(rollout.generate([[5, 6]], SamplingParams(max_new_tokens=2))) == 1  # still serving


def test_rollout_rejects_wrong_weights_and_keeps_serving(services):
    import torch

    from hybridflow.weights.client import GrpcWeightSyncClient

    rollout, _, rollout_server, _, _ = services
    sender = GrpcWeightSyncClient(rollout_server.address)
    before = rollout.status().policy_version
    with pytest.raises(grpc.RpcError) as err:
        sender.send([("model.embed_tokens.weight", torch.zeros(3, 3))], 99)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model.embed_tokens.weight" in err.value.details() and "shape" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        sender.send([("no.such.tensor", torch.zeros(2))], 99)
    assert "no.such.tensor" in err.value.details()
    assert rollout.status().policy_version == before


def learner_batch(**overrides):
    samples = [
        TrainSample([5, 6], [7, 8], [-1.0, -1.0], 1.0, 0, 0),
        TrainSample([5, 6], [9], [-1.0], 0.0, 0, 0),
    ]
    msg = learner_convert.batch_to_proto(samples)
    for key, value in overrides.items():
        getattr(msg, key).CopyFrom(value) if hasattr(value, "DESCRIPTOR") else setattr(
            msg, key, value
        )
    return msg


@pytest.mark.parametrize(
    "batch, field",
    [
        (learner_batch(rewards=pack_floats([1.0, float("nan")])), "batch.rewards[1] is not finite"),
        (learner_batch(rewards=pack_floats([1.0])), "batch.rewards: expected 2 values"),
        (
            learner_batch(
                rollout_logprobs=common_pb2.Tensor(dtype="float64", shape=[3], data=b"\0" * 24)
            ),
            "batch.rollout_logprobs: dtype must be float32",
        ),
        (
            learner_batch(responses=pack_tokens([[7, 8], [123456]])),
            "batch.responses[1]: token id 123456",
        ),
        (learner_pb2.TrainBatch(), "batch: no samples"),
    ],
)
def test_learner_bad_input_is_invalid_argument(services, batch, field):
    _, learner, _, learner_server, _ = services
    stub = learner_pb2_grpc.LearnerServiceStub(make_channel(learner_server.address))
    with pytest.raises(grpc.RpcError) as err:
        stub.TrainStep(stream_message(batch, 65536), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    assert learner.compute_logprobs([[5]], [[6]], 1.0)[0][0] < 0  # still serving


def test_oversize_train_batch_is_rejected(services):
    _, learner, _, learner_server, _ = services
    stub = learner_pb2_grpc.LearnerServiceStub(make_channel(learner_server.address))
    huge = learner_pb2.TrainBatch(group_ids=[2**40] * 1_000_000)  # ~6 MB > 4 MiB limit
    with pytest.raises(grpc.RpcError) as err:
        stub.TrainStep(stream_message(huge, MIB), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds server.max_message_bytes" in err.value.details()
    big_client = GrpcLearnerClient(
        learner_server.address, ChannelConfig(max_message_bytes=64 * MIB)
    )
    assert big_client.compute_logprobs([[5]], [[6]], 1.0)


@pytest.mark.parametrize("module", ["hybridflow.main.rollout", "hybridflow.main.learner"])
def test_unknown_model_path_fails_clearly(module, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--set",
            f"model={tmp_path / 'missing'}",
            "--port-file",
            str(tmp_path / "addr"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "not a local checkpoint directory" in proc.stderr
    assert not (tmp_path / "addr").exists()
