"""Finding 6: eight stalled UpdateWeights streams (a header, then nothing) took all 8 worker
threads and health checks timed out; eight TrainStep streams declaring 256 MiB each grew the
learner by 2 GB, which stayed. Now calls beyond server.max_concurrent_rpcs are refused at
once, health has reserved threads, an idle client stream is cancelled after
server.stream_idle_timeout_s, and a declared size is never allocated up front."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import grpc
import psutil
import pytest

from hybridflow.rpc.channel import check_health, make_channel
from hybridflow.rpc.codec import pack_tokens
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import RunningServer, start_server
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc, weight_sync_pb2_grpc
from hybridflow.weights.servicer import SERVICE_NAME as WEIGHT_SYNC_SERVICE
from hybridflow.weights.servicer import WeightSyncServicer
from tests.helpers import MIB, start_learner_server, start_rollout_server


def _wait_for(condition, what: str, timeout_s: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _stalled_weights(release: threading.Event) -> Iterator[common_pb2.WeightChunk]:
    meta = common_pb2.TensorMeta(name="w", dtype="uint8", shape=[4096], num_bytes=4096)
    header = common_pb2.WeightHeader(policy_version=1, tensors=[meta], total_bytes=4096)
    yield common_pb2.WeightChunk(header=header)
    release.wait(60)


def _limits(server: RunningServer):  # noqa: ANN202
    assert server.limits is not None
    return server.limits


def test_stalled_streams_are_shed_and_health_still_answers(tiny_model_path):
    server, _ = start_rollout_server(tiny_model_path)  # max_workers 8, the finding's setup
    channel = make_channel(server.address)
    weights = weight_sync_pb2_grpc.WeightSyncServiceStub(channel)
    release = threading.Event()
    stalled: list[Future] = []
    try:
        for _ in range(8):
            stalled.append(weights.UpdateWeights.future(_stalled_weights(release), timeout=60))
        _wait_for(lambda: _limits(server).in_flight == 8, "8 streams in flight")
        assert check_health(channel, timeout_s=10)
        start = time.perf_counter()
        with pytest.raises(grpc.RpcError) as err:
            list(
                rollout_pb2_grpc.RolloutServiceStub(channel).Generate(
                    rollout_pb2.GenerateRequest(
                        prompts=pack_tokens([[5, 6]]),
                        sampling=common_pb2.SamplingParams(
                            temperature=1, top_p=1, max_new_tokens=2, n=1
                        ),
                    ),
                    timeout=30,
                )
            )
        shed_s = time.perf_counter() - start
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "server.max_concurrent_rpcs=8" in err.value.details()
        assert _limits(server).num_refused >= 1
        print(f"9th call shed in {shed_s * 1e3:.1f} ms with 8 stalled streams; health answered")
    finally:
        release.set()
        for f in stalled:
            assert f.exception(timeout=60) is not None  # they were short: INVALID_ARGUMENT
        channel.close()
        server.stop(0)


def test_idle_client_stream_is_cancelled(tiny_model_path):
    from hybridflow.services.rollout.engine import HFEngine

    rollout = LocalRollout(HFEngine(tiny_model_path), "tiny")
    servicer = WeightSyncServicer(rollout, 64 * MIB)
    server = start_server(
        ServerConfig(max_workers=2, stream_idle_timeout_s=0.3),
        lambda s: weight_sync_pb2_grpc.add_WeightSyncServiceServicer_to_server(servicer, s),
        [WEIGHT_SYNC_SERVICE],
    )
    channel = make_channel(server.address)
    release = threading.Event()
    try:
        stub = weight_sync_pb2_grpc.WeightSyncServiceStub(channel)
        call = stub.UpdateWeights.future(_stalled_weights(release), timeout=60)
        exc = call.exception(timeout=60)
        assert exc is not None and exc.code() == grpc.StatusCode.CANCELLED
        assert _limits(server).watchdog.num_cancelled == 1
        _wait_for(lambda: _limits(server).in_flight == 0, "the worker to be released")
        assert stub.Describe(common_pb2.Empty(), timeout=10).tensor_parallel_size == 1
    finally:
        release.set()
        channel.close()
        server.stop(0)


def test_declared_stream_sizes_are_not_allocated(tiny_model_path):
    max_bytes = 64 * MIB
    server, _ = start_learner_server(tiny_model_path, max_bytes=max_bytes)
    channel = make_channel(server.address)
    release = threading.Event()

    def declaring(total: int) -> Iterator[common_pb2.Chunk]:
        yield common_pb2.Chunk(total_bytes=total, offset=0, data=b"x" * 1024)
        release.wait(60)

    from hybridflow.v1 import learner_pb2_grpc

    stub = learner_pb2_grpc.LearnerServiceStub(channel)
    process = psutil.Process()
    try:
        rss_before = process.memory_info().rss
        calls = [stub.TrainStep.future(declaring(max_bytes - 1), timeout=60) for _ in range(8)]
        _wait_for(lambda: _limits(server).in_flight == 8, "8 TrainStep streams in flight")
        rss_during = process.memory_info().rss
        release.set()
        for call in calls:
            exc = call.exception(timeout=60)
            assert exc is not None and exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        rss_after = process.memory_info().rss
        print(
            f"8 streams declaring {max_bytes >> 20} MiB: RSS {rss_before >> 20} -> "
            f"{rss_during >> 20} (in flight) -> {rss_after >> 20} MiB (closed)"
        )
        assert rss_during - rss_before < max_bytes  # 8 preallocations would be 8x this
        assert rss_after - rss_before < max_bytes
    finally:
        release.set()
        channel.close()
        server.stop(0)
