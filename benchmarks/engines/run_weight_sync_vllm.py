"""Weight sync into a vLLM replica, same run: planner against naive against gRPC.

    python benchmarks/engines/run_weight_sync_vllm.py                 # 100m, TP 2, 5 syncs
    python benchmarks/engines/run_weight_sync_vllm.py --model tiny --syncs 3
    python benchmarks/engines/run_weight_sync_vllm.py --model builtin:qwen2.5-0.5b-shape --syncs 3

One real rollout service process (``rollout.engine=vllm``, ``tensor_parallel_size`` TP
workers) and one in-process learner (one rank) holding the same model. Each variant is a
learner core with its own ``weight_sync`` config: ``dist`` + ``planner`` (each TP worker
receives only its slices along the resharding plan), ``dist`` + ``naive`` (whole tensors
broadcast to every TP worker), and ``grpc`` (the full model streamed to the service, handed
to the workers whole). A sync is timed from the learner's publish until the replica serves
the new weights (received and reloaded into vLLM). The first sync of each variant builds the
group and is not timed. Blocks of ``--syncs`` syncs alternate over ``--rounds`` rounds.

Writes ``results/weight_sync_vllm_YYYYMMDD_HHMMSS/summary.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

VARIANTS = {
    "planner": {"transport": "dist", "executor": "planner"},
    "naive": {"transport": "dist", "executor": "naive"},
    "grpc": {"transport": "grpc", "executor": "planner"},
}
MIB = 1024 * 1024


def start_service(
    model_path: Path, tp: int, tmp: Path, extra: Sequence[str] = ()
) -> tuple[subprocess.Popen, str, Path]:
    """A vLLM rollout service of ``model_path`` at TP ``tp`` (``extra``: more ``--set`` keys);
    (its process, its address, its log)."""
    port_file, log_path = tmp / "rollout.port", tmp / "rollout.log"
    cmd = [
        sys.executable, "-m", "hybridflow.main.rollout", "--port-file", str(port_file),
        "--set", f"model={model_path}", "--set", "rollout.engine=vllm",
        "--set", f"rollout.tensor_parallel_size={tp}", "--set", "rollout.max_model_len=64",
        "--set", "rollout.server.max_message_bytes=1073741824",
        "--set", "weight_sync.timeout_s=600", *[a for k in extra for a in ("--set", k)],
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"rollout service did not start; see {log_path}")
        time.sleep(0.2)
    return proc, port_file.read_text().strip(), log_path


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def dist_split(log_path: Path, syncs: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per dist variant, median seconds the replica spent receiving vs applying (vLLM's
    reload) over the timed syncs, from the rollout service's log (syncs appear in schedule
    order: per round, each dist variant's untimed first sync then its timed ones)."""
    pattern = re.compile(r"received \d+ bytes in ([\d.]+) s, staged/applied in ([\d.]+) s")
    found = [tuple(map(float, m.groups())) for m in pattern.finditer(log_path.read_text())]
    per: dict[str, list[tuple[float, ...]]] = {"planner": [], "naive": []}
    i = 0
    for _ in range(rounds):
        for variant in per:
            per[variant] += found[i + 1 : i + 1 + syncs]
            i += 1 + syncs
    return {
        v: {
            "receive_s": statistics.median(r for r, _ in rows),
            "apply_s": statistics.median(a for _, a in rows),
        }
        for v, rows in per.items()
        if rows
    }


def make_core(worker: Any, variant: str) -> Any:
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.weights.client import GrpcWeightSyncClient
    from hybridflow.weights.config import WeightSyncConfig

    channel = ChannelConfig(max_message_bytes=1 << 30, timeout_s=600)
    cfg = WeightSyncConfig(**VARIANTS[variant], timeout_s=600)  # type: ignore[arg-type]
    return LearnerCore(worker, 0, cfg, lambda a: GrpcWeightSyncClient(a, channel))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        default="100m",
        help="100m (a Llama built here), or a model spec: builtin:tiny, "
        "builtin:qwen2.5-0.5b-shape, a checkpoint directory",
    )
    parser.add_argument("--tp", type=int, default=2, help="TP workers of the vLLM replica")
    parser.add_argument("--syncs", type=int, default=5, help="timed syncs per variant and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    # The rollout service refuses state-changing calls without a token (safe default): one
    # for this run, inherited by the service and read by this process's weight-sync clients.
    os.environ.setdefault("HYBRIDFLOW_TOKEN", secrets.token_hex(16))
    from benchmarks.common.runner import environment
    from benchmarks.engines.run_engines import build_100m
    from hybridflow.models import resolve_model_path
    from hybridflow.services.learner.config import LearnerConfig
    from hybridflow.services.learner.worker import LearnerWorker

    out = args.results / time.strftime("weight_sync_vllm_%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.model == "100m":
            path = build_100m(tmp / "llama-100m")
        else:  # "tiny" is the old spelling of builtin:tiny
            path = resolve_model_path("builtin:tiny" if args.model == "tiny" else args.model)
        worker = LearnerWorker(LearnerConfig(), path)
        model_bytes = sum(p.numel() * p.element_size() for p in worker.actor.parameters())
        proc, address, log_path = start_service(path, args.tp, tmp)
        seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
        bytes_per_rank: dict[str, float] = {}
        try:
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    core = make_core(worker, variant)
                    report = core.publish_weights([address])  # builds the group: untimed
                    received = report.num_bytes
                    for _ in range(args.syncs):
                        report = core.publish_weights([address])
                        seconds[variant].append(report.duration_s)
                    core.shutdown()
                    if variant != "grpc":  # the dist receivers count what the TP ranks got
                        bytes_per_rank[variant] = received / args.tp
                    else:
                        bytes_per_rank[variant] = float(model_bytes)
                    print(f"{variant}: {statistics.median(seconds[variant]):.3f} s/sync")
        finally:
            stop(proc)
            (out / "rollout.log").write_bytes(log_path.read_bytes())
    med = {v: statistics.median(s) for v, s in seconds.items()}
    split = dist_split(out / "rollout.log", args.syncs, args.rounds)
    summary = {
        "suite": "weight_sync_vllm",
        "model": args.model,
        "model_bytes": model_bytes,
        "tp": args.tp,
        "seconds_per_sync": med,
        "repeats_s": seconds,
        "bytes_per_tp_rank": bytes_per_rank,
        "dist_receive_vs_apply_s": split,
        "ratios": {
            "naive_over_planner_s": med["naive"] / med["planner"],
            "grpc_over_planner_s": med["grpc"] / med["planner"],
            "planner_over_naive_bytes_per_rank": bytes_per_rank["planner"]
            / bytes_per_rank["naive"],
        },
        **environment(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{'variant':8} {'s/sync':>8} {'MiB per TP rank':>16}")
    for v in VARIANTS:
        print(f"{v:8} {med[v]:8.3f} {bytes_per_rank[v] / MIB:16.1f}")
    print(json.dumps({"ratios": summary["ratios"], "dist_receive_vs_apply_s": split}, indent=2))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
