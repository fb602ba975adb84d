"""Reward service samples/s: arithmetic items through a real reward service process.

The service runs as deployed (``python -m hybridflow.main.reward``, its own process, port
file, health check); items are scored in ``batch_size`` batches over gRPC. The same items
through the in-process ``RewardScorer`` give the scoring cost without the service around it.
Knows the reward client and scorer; nothing of training.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.integration.config import RewardBench
from benchmarks.integration.timing import DetailedLog, stats, timed

REPO = Path(__file__).resolve().parents[2]


def make_items(num: int) -> list[Any]:
    """Arithmetic items, every other one answered correctly."""
    from hybridflow.data.arith import make_arith_rows
    from hybridflow.types import ScoreItem

    items = []
    for i, row in enumerate(make_arith_rows(num, seed=99)):
        truth = row["reward_model"]["ground_truth"]
        answer = truth if i % 2 == 0 else str(int(truth) + 1)
        items.append(ScoreItem("arith", answer, truth, row["prompt"], {"index": i}))
    return items


def start_reward_service(
    work_dir: Path, timeout_s: float = 120.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts the reward service process; returns it and its address once healthy."""
    from hybridflow.rpc.channel import wait_healthy

    port_file = work_dir / "reward.addr"
    port_file.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    with (work_dir / "reward_service.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hybridflow.main.reward", "--port-file", str(port_file)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"reward service exited ({proc.returncode}); see {out.name}")
        if time.monotonic() > deadline:
            stop_service(proc)
            raise TimeoutError(f"reward service not serving after {timeout_s:.0f}s")
        time.sleep(0.1)  # another process's file: nothing local to wait on
    address = port_file.read_text().strip()
    wait_healthy(address, max(1.0, deadline - time.monotonic()))
    return proc, address


def stop_service(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
            proc.wait()


def run(cfg: RewardBench, log: DetailedLog, work_dir: Path) -> dict[str, Any]:
    from hybridflow.services.reward.client import GrpcRewardClient
    from hybridflow.services.reward.scorers import RewardScorer

    items = make_items(cfg.num_items)
    batches = [items[i : i + cfg.batch_size] for i in range(0, len(items), cfg.batch_size)]

    def score_all(score: Any) -> float:
        return sum(r.score for batch in batches for r in score(batch))

    scorer = RewardScorer()
    local_s, local_scores = timed(
        lambda: score_all(scorer.score_batch), cfg.repeats, cfg.warmup, log, "reward",
        "in_process_scorer", lambda total: {"items": len(items), "score_sum": total},
    )  # fmt: skip
    scorer.close()
    proc, address = start_reward_service(work_dir)
    try:
        client = GrpcRewardClient(address)
        grpc_s, grpc_scores = timed(
            lambda: score_all(client.score_batch), cfg.repeats, cfg.warmup, log, "reward",
            "reward_service", lambda total: {"items": len(items), "score_sum": total},
        )  # fmt: skip
        client.close()
    finally:
        stop_service(proc)
    if grpc_scores != local_scores:
        raise RuntimeError(f"reward service scores {grpc_scores} != in-process {local_scores}")
    service_rate = len(items) / stats(grpc_s)["median_s"]
    local_rate = len(items) / stats(local_s)["median_s"]
    return {
        "num_items": len(items),
        "batch_size": cfg.batch_size,
        "correct_fraction": grpc_scores[0] / len(items),
        "reward_service": {**stats(grpc_s), "samples_per_s": service_rate},
        "in_process_scorer": {**stats(local_s), "samples_per_s": local_rate},
        "service_over_in_process_samples_per_s": service_rate / local_rate,
    }
