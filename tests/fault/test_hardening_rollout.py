"""Finding 5: a 58-byte Generate with n = 2**31-1 grew the rollout service's memory without
bound; a Generate whose client deadline expired kept running (the next request waited 13.9 s).
Now per-request limits refuse it at once, naming the config key, and a cancelled or expired
Generate stops within one decode step. Also the reward service's per-request limits."""

from __future__ import annotations

import threading
import time

import grpc
import psutil
import pytest

from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.codec import pack_tokens
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.services.reward.servicer import SERVICE_NAME as REWARD_SERVICE
from hybridflow.services.reward.servicer import RewardServicer
from hybridflow.services.rollout.requests import Cancelled, RequestLimits, check_request_limits
from hybridflow.types import SamplingParams
from hybridflow.v1 import common_pb2, reward_pb2, reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from tests.helpers import start_rollout_server


@pytest.fixture(scope="module")
def rollout_service(tiny_model_path):  # noqa: ANN201
    server, rollout = start_rollout_server(tiny_model_path)
    channel = make_channel(server.address)
    yield server, rollout, rollout_pb2_grpc.RolloutServiceStub(channel)
    channel.close()
    server.stop(0)


def _request(n: int = 1, max_new_tokens: int = 4, prompts=None) -> rollout_pb2.GenerateRequest:  # noqa: ANN001
    return rollout_pb2.GenerateRequest(
        request_id="r",
        prompts=pack_tokens(prompts or [[5, 6, 7]]),
        sampling=common_pb2.SamplingParams(
            temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, n=n
        ),
    )


def test_huge_n_is_refused_at_once_without_memory_growth(rollout_service):
    _, _, stub = rollout_service
    request = _request(n=2**31 - 1)
    assert request.ByteSize() < 64  # the finding's 58-byte request
    rss_before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request, timeout=30))
    refused_s = time.perf_counter() - start
    rss_after = psutil.Process().memory_info().rss
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rollout.max_n=64" in err.value.details()
    print(f"n=2**31-1 refused in {refused_s * 1e3:.1f} ms; RSS {rss_before >> 20} -> "
          f"{rss_after >> 20} MiB")  # fmt: skip
    assert rss_after - rss_before < 32 * 1024 * 1024


@pytest.mark.parametrize(
    ("request_kwargs", "key"),
    [
        ({"max_new_tokens": 10**6}, "rollout.max_new_tokens_limit"),
        ({"prompts": [[5]] * 1025}, "rollout.max_prompts_per_request"),
        ({"n": 64, "max_new_tokens": 4096, "prompts": [[5]] * 8}, "rollout.max_tokens_per_request"),
    ],
)
def test_generate_limits_name_their_key(rollout_service, request_kwargs, key):
    _, _, stub = rollout_service
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(_request(**request_kwargs), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert key in err.value.details()


def test_request_limits_accept_the_bounds_themselves():
    limits = RequestLimits(max_n=4, max_new_tokens_limit=8, max_prompts_per_request=2)
    check_request_limits(2, 10, 4, 8, limits)
    with pytest.raises(ValueError, match="rollout.max_n=4"):
        check_request_limits(2, 10, 5, 8, limits)


def test_expired_generate_stops_within_a_decode_step(rollout_service):
    _, rollout, stub = rollout_service
    engine = rollout.engine
    eos = engine.eos_token_id
    engine.eos_token_id = engine.vocab_size + 1  # nothing ends the request but the deadline
    cancelled_before = rollout.num_cancelled
    try:
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(_request(max_new_tokens=4096), timeout=0.3))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        deadline = time.monotonic() + 60
        while rollout.num_cancelled == cancelled_before:
            assert time.monotonic() < deadline, "the expired request never stopped"
            time.sleep(0.01)
        # It stopped early: far fewer steps than it asked for.
        assert rollout.last_cancelled_steps is not None
        assert rollout.last_cancelled_steps < 4096
        print(f"expired Generate stopped after {rollout.last_cancelled_steps} decode steps")
    finally:
        engine.eos_token_id = eos
    # The next request is served (the engine is free again).
    replies = list(stub.Generate(_request(max_new_tokens=2), timeout=60))
    assert sum(r.num_prompts for r in replies) == 1


def test_engine_should_stop_is_polled_every_step(rollout_service):
    _, rollout, _ = rollout_service
    calls = []

    def stop_after_three() -> bool:
        calls.append(1)
        return len(calls) > 3

    engine = rollout.engine
    eos = engine.eos_token_id
    engine.eos_token_id = engine.vocab_size + 1
    try:
        with pytest.raises(Cancelled) as err:
            engine.generate([[5, 6]], SamplingParams(max_new_tokens=100), stop_after_three)
    finally:
        engine.eos_token_id = eos
    assert err.value.num_steps == 3


def test_reward_limits_name_their_key():
    servicer = RewardServicer(
        RewardScorer(RewardConfig()), RewardConfig(max_items_per_request=4, max_text_bytes=1000)
    )
    running = start_server(
        ServerConfig(),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        [REWARD_SERVICE],
    )
    channel = make_channel(running.address)
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    item = reward_pb2.ScoreItem(data_source="arith", response="4", has_ground_truth=True,
                                ground_truth="4")  # fmt: skip
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Score(reward_pb2.ScoreRequest(items=[item] * 5), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reward.max_items_per_request=4" in err.value.details()
        big = reward_pb2.ScoreItem(data_source="arith", response="9" * 1001)
        with pytest.raises(grpc.RpcError) as err:
            stub.Score(reward_pb2.ScoreRequest(items=[big]), timeout=30)
        assert "items[0].response" in err.value.details()
        assert "reward.max_text_bytes=1000" in err.value.details()
        reply = stub.Score(reward_pb2.ScoreRequest(items=[item] * 4), timeout=30)
        assert len(reply.results) == 4 and reply.num_errors == 0
    finally:
        channel.close()
        running.stop(0)


def test_queued_generate_whose_caller_left_never_runs(rollout_service):
    _, rollout, _ = rollout_service
    gone = threading.Event()
    gone.set()
    cancelled_before = rollout.num_cancelled
    with pytest.raises(Cancelled):
        rollout.generate([[5, 6]], SamplingParams(max_new_tokens=4), "q", gone.is_set)
    assert rollout.num_cancelled == cancelled_before + 1
    assert rollout.last_cancelled_steps == 0
