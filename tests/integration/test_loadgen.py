"""hybridflow-loadgen end to end: the CLI against a real rollout service (tiny model) and a
real reward service, against a dead address (UNAVAILABLE, no hang), a sweep that writes its
curve, and the generator's own overhead against instant fake services."""

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.loadgen.config import MAX_REQUESTS, LoadgenConfig
from hybridflow.loadgen.schedule import RunBounds, poisson_arrivals
from hybridflow.loadgen.sweep import run_points
from hybridflow.rpc.codec import pack_tokens
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.services.reward.servicer import SERVICE_NAME as REWARD_SERVICE
from hybridflow.services.reward.servicer import RewardServicer
from hybridflow.services.rollout.servicer import SERVICE_NAME as ROLLOUT_SERVICE
from hybridflow.v1 import common_pb2, reward_pb2, reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from tests.helpers import start_rollout_server

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def run_cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.loadgen", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def only_run(path: Path) -> dict:
    report = json.loads(path.read_text())
    assert report["tool"] == "hybridflow-loadgen" and report["environment"]["cpu_count"] >= 1
    (run,) = report["runs"]
    return run


def assert_ordered_latency(dist: dict) -> None:
    assert 0 < dist["p50"] <= dist["p90"] <= dist["p99"] <= dist["max"]


class InstantRollout(rollout_pb2_grpc.RolloutServiceServicer):
    """Answers Generate at once with one 1-token completion per prompt and sample."""

    def Generate(self, request, context):
        count = (len(request.prompts.offsets) - 1) * request.sampling.n
        yield rollout_pb2.GenerateResponse(
            request_id=request.request_id,
            num_prompts=len(request.prompts.offsets) - 1,
            completions=common_pb2.Completions(tokens=pack_tokens([[5]] * count)),
        )

    def GetInfo(self, request, context):
        return rollout_pb2.RolloutInfo(vocab_size=32, eos_token_id=2)


class InstantReward(reward_pb2_grpc.RewardServiceServicer):
    def Score(self, request, context):
        return reward_pb2.ScoreResponse(
            results=[reward_pb2.ScoreResult(score=1.0)] * len(request.items)
        )


def serve_reward(servicer):
    return start_server(
        ServerConfig(max_message_bytes=MIB),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        [REWARD_SERVICE],
    )


@pytest.fixture(scope="module")
def rollout_server(tiny_model_path):
    running, rollout = start_rollout_server(tiny_model_path)
    yield running, rollout
    running.stop(0)


@pytest.fixture(scope="module")
def reward_address():
    running = serve_reward(RewardServicer(RewardScorer(RewardConfig())))
    yield running.address
    running.stop(0)


@pytest.fixture
def fake_reward_address():
    running = serve_reward(InstantReward())
    yield running.address
    running.stop(0)


@pytest.fixture
def fake_rollout_address():
    running = start_server(
        ServerConfig(max_message_bytes=MIB),
        lambda s: rollout_pb2_grpc.add_RolloutServiceServicer_to_server(InstantRollout(), s),
        [ROLLOUT_SERVICE],
    )
    yield running.address
    running.stop(0)


def test_open_loop_against_the_real_rollout_service(rollout_server, tmp_path):
    running, rollout = rollout_server
    before = rollout.status().num_requests
    out = tmp_path / "rollout.json"
    proc = run_cli(
        "--target", "rollout", "--address", running.address, "--rate", "4", "--duration", "2",
        "--warmup", "0.5", "--prompt-len", "4:12", "--batch-size", "2", "--n", "2",
        "--max-new-tokens", "8", "--timeout", "20", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run = only_run(out)
    # The seeded schedule fixes how many requests were due, and when.
    arrivals = list(poisson_arrivals(4.0, 0, RunBounds(2.0, MAX_REQUESTS)))
    assert run["num_warmup"] == sum(t < 0.5 for t in arrivals)
    assert run["num_sent"] == run["num_ok"] == len(arrivals) - run["num_warmup"] > 0
    assert run["num_errors"] == 0 and run["errors"] == {}
    assert rollout.status().num_requests - before == len(arrivals)
    completions = run["items_per_s"] * run["window_s"]
    assert completions == pytest.approx(run["num_ok"] * 2 * 2)
    tokens = run["output_tokens_per_s"] * run["window_s"]
    assert completions <= tokens + 1e-6 and tokens <= completions * 8 + 1e-6
    assert_ordered_latency(run["latency_ms"])
    assert_ordered_latency(run["first_result_ms"])
    assert run["first_result_ms"]["p50"] <= run["latency_ms"]["p50"]
    assert "open" in proc.stdout and "tok/s" in proc.stdout


def test_closed_loop_against_the_real_reward_service(reward_address, tmp_path):
    out = tmp_path / "reward.json"
    proc = run_cli(
        "--target", "reward", "--address", reward_address, "--concurrency", "2",
        "--duration", "1.5", "--items-per-request", "4", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run = only_run(out)
    assert run["mode"] == "closed" and run["load"] == 2.0
    assert run["num_errors"] == 0 and run["num_item_errors"] == 0
    assert run["num_ok"] == run["num_sent"] > 5
    assert run["items_per_s"] * run["window_s"] == pytest.approx(run["num_ok"] * 4)
    assert run["first_result_ms"] is None  # unary: latency is the time to the result
    assert_ordered_latency(run["latency_ms"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_address_reports_unavailable_without_hanging(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    out = tmp_path / "dead.json"
    proc = run_cli(
        "--target", "reward", "--address", address, "--rate", "50", "--requests", "5",
        "--timeout", "3", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    run = only_run(out)
    assert run["errors"] == {"UNAVAILABLE": 5} and run["num_ok"] == 0
    assert "UNAVAILABLE=5" in proc.stdout
    # Rollout needs GetInfo first: a clear error, exit status 3.
    proc = run_cli("--target", "rollout", "--address", address, "--rate", "5", "--requests", "2")
    assert proc.returncode == 3 and "UNAVAILABLE" in proc.stderr


def test_sweep_writes_points_json_and_curve_png(fake_reward_address, tmp_path):
    out = tmp_path / "sweep" / "reward.json"
    proc = run_cli(
        "--target", "reward", "--address", fake_reward_address, "--sweep-rates", "20,40",
        "--duration", "0.5", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [r["load"] for r in report["runs"]] == [20.0, 40.0]
    assert report["config"]["sweep_rates"] == [20.0, 40.0]
    assert (tmp_path / "sweep" / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("target", ["rollout", "reward"])
def test_generator_against_an_instant_service(target, fake_rollout_address, fake_reward_address):
    """Open loop sends exactly its Poisson schedule and closed loop keeps its concurrency,
    with no errors, against an instant server. Timing is not asserted here (tests check
    behaviour); the generator's own overhead is printed and measured in benchmarks."""
    address = fake_rollout_address if target == "rollout" else fake_reward_address
    cfg = LoadgenConfig(target=target, address=address, rate=200.0, duration_s=1.0)
    cfg.rollout.prompts_per_request = 4
    cfg.rollout.n = 2
    (open_run,) = asyncio.run(run_points(cfg))
    expected = len(list(poisson_arrivals(200.0, 0, RunBounds(1.0, MAX_REQUESTS))))
    assert open_run.num_sent == open_run.num_ok == expected
    assert open_run.send_lag_ms is not None and open_run.latency_ms is not None
    cfg = LoadgenConfig(target=target, address=address, concurrency=8, duration_s=1.0)
    (closed_run,) = asyncio.run(run_points(cfg))
    assert closed_run.num_errors == 0 and closed_run.num_ok > 8
    print(
        f"{target}: open 200 req/s send lag p50/p99 {open_run.send_lag_ms.p50:.2f}/"
        f"{open_run.send_lag_ms.p99:.2f} ms; closed c=8 {closed_run.requests_per_s:.0f} req/s"
    )
