"""server.metrics_port: a reward server's Prometheus endpoint, scraped over HTTP, counts calls
and errors by method and code, times them, and keeps its series apart from other servers."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import RunningServer, start_server
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.services.reward.servicer import SERVICE_NAME, RewardServicer
from hybridflow.v1 import reward_pb2, reward_pb2_grpc

SCORE = f"{SERVICE_NAME}/Score"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def reward_server(metrics_port: int | None) -> Iterator[RunningServer]:
    servicer = RewardServicer(RewardScorer())
    running = start_server(
        ServerConfig(metrics_port=metrics_port),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    try:
        yield running
    finally:
        running.stop(0)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: (name, sorted labels) → value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def score_calls(running: RunningServer, good: int, bad: int) -> None:
    channel = make_channel(running.address)
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    item = reward_pb2.ScoreItem(
        data_source="arith", response="7", has_ground_truth=True, ground_truth="7"
    )
    for _ in range(good):
        assert stub.Score(reward_pb2.ScoreRequest(items=[item]), timeout=10).results[0].score == 1
    broken = reward_pb2.ScoreItem(data_source="arith", extra_info_json="{oops")
    for _ in range(bad):
        with pytest.raises(grpc.RpcError) as info:
            stub.Score(reward_pb2.ScoreRequest(items=[broken]), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()


def test_endpoint_counts_calls_and_errors_by_method_and_times_them() -> None:
    port = free_port()
    with reward_server(port) as running:
        assert running.metrics is not None and running.metrics_port == port
        running.metrics.gauge("hybridflow_policy_version", "version served", lambda: 5)
        running.metrics.counter("hybridflow_rollout_generated_tokens", "tokens", lambda: 42)
        score_calls(running, good=3, bad=1)
        samples = scrape(port)
    method = (("method", SCORE), ("service", "reward"))

    def requests(code: str) -> float:
        labels = (("code", code), ("method", SCORE), ("service", "reward"))
        return samples[("hybridflow_rpc_requests_total", labels)]

    assert requests("OK") == 3
    assert requests("INVALID_ARGUMENT") == 1
    assert samples[("hybridflow_rpc_latency_seconds_count", method)] == 4
    assert samples[("hybridflow_rpc_latency_seconds_bucket", (("le", "+Inf"), *method))] == 4
    assert samples[("hybridflow_rpc_latency_seconds_sum", method)] > 0
    assert samples[("hybridflow_rpc_in_flight", (("service", "reward"),))] == 0
    assert samples[("hybridflow_policy_version", (("service", "reward"),))] == 5
    assert samples[("hybridflow_rollout_generated_tokens_total", (("service", "reward"),))] == 42
    # Health checks and reflection are not counted: Score is the only method seen.
    counted = {dict(k[1]).get("method") for k in samples if k[0] == "hybridflow_rpc_requests_total"}
    assert counted == {SCORE}


def test_each_server_keeps_its_own_series_and_closes_its_endpoint() -> None:
    first, second = free_port(), free_port()
    with reward_server(first) as a, reward_server(second):
        score_calls(a, good=2, bad=0)
        ok = (("code", "OK"), ("method", SCORE), ("service", "reward"))
        assert scrape(first)[("hybridflow_rpc_requests_total", ok)] == 2
        assert ("hybridflow_rpc_requests_total", ok) not in scrape(second)
    with pytest.raises(OSError):  # stopped with the server
        scrape(first)


def test_metrics_are_off_by_default() -> None:
    with reward_server(None) as running:
        assert running.metrics is None and running.metrics_port == 0
    with reward_server(0) as running:
        assert running.metrics is None


def test_metrics_port_is_validated_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"server.metrics_port: must be in \[0, 65535\]"):
        ServerConfig(metrics_port=70000).validate()
    with pytest.raises(ValueError, match=r"server.metrics_port: must differ from server.port"):
        ServerConfig(port=9000, metrics_port=9000).validate()
