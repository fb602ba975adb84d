"""LoRA against full weights, same run, on the ~100M-parameter Llama of the weight-sync
benchmarks: bytes and seconds per verified sync into a vLLM replica, and the learner's peak
memory over a train step.

    python benchmarks/lora/run_lora.py                      # rank 16, TP 1, 5 syncs x 2 rounds
    python benchmarks/lora/run_lora.py --rank 64 --tp 2 --syncs 3

Sync: one in-process learner (one rank) per variant, one real rollout service process per
variant (``rollout.engine=vllm``): ``full`` (every weight along the planner, ``dist``),
``lora_adapter`` and ``lora_merged`` (the adapters only, ``weight_sync.lora`` adapter /
merged). Every sync is verified (the full variant with ``weight_sync.verify: true``, so the
same log-prob probe runs in each). A sync is timed from the learner's publish call until it
returns: weights received, applied (for ``lora_adapter``: the PEFT directory written) and the
probe answered (which is when vLLM loads a new adapter); ``send s`` is the same sync without
the probe (sent, received, applied); ``probes s`` are one more learner and one more replica
probe after each sync, outside its timing (the replica's adapter is loaded by then). The
first sync of each variant forms the group and is not timed; variants alternate over
``--rounds``. ``generate s``: one fixed request (8 prompts x 4 samples x <= 32 tokens) on each
replica afterwards: what serving an adapter, rather than plain weights, costs generation.

Memory: each variant in a fresh process builds the learner (``LearnerWorker``), runs
``--steps`` train steps on one fixed GRPO batch (``--samples`` x ``--tokens`` tokens), and
reports its peak RSS (``VmHWM``) over what it held once built (``clear_refs`` resets it), and
the optimizer's state in bytes.

Writes ``results/lora_YYYYMMDD_HHMMSS/summary.json`` and prints both tables. Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MIB = 1024 * 1024
VARIANTS = ("full", "lora_adapter", "lora_merged")


def lora_keys(variant: str, rank: int) -> list[str]:
    if variant == "full":
        return []
    mode = variant.removeprefix("lora_")
    return [
        f"learner.lora.rank={rank}",
        f"learner.lora.alpha={2 * rank}",
        f"weight_sync.lora={mode}",
    ]


def learner_core(path: Path, variant: str, rank: int) -> Any:
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.services.learner.config import LearnerConfig
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.weights.client import GrpcWeightSyncClient
    from hybridflow.weights.config import WeightSyncConfig

    config = LearnerConfig()
    mode = "adapter"
    if variant != "full":
        config.lora.rank, config.lora.alpha = rank, 2.0 * rank
        mode = variant.removeprefix("lora_")
    worker = LearnerWorker(config, path)
    sync = WeightSyncConfig(transport="dist", timeout_s=600, verify=True, lora=mode)  # type: ignore[arg-type]
    channel = ChannelConfig(max_message_bytes=1 << 30, timeout_s=600)
    return LearnerCore(worker, 0, sync, lambda a: GrpcWeightSyncClient(a, channel))


def perturb(worker: Any) -> None:
    """A new version with changed weights (what a train step would give), cheaply."""
    import torch

    params = (
        worker.adapters.parameters() if worker.adapters is not None else worker.actor.parameters()
    )
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p), alpha=1e-3)
    worker.policy_version += 1


def probe_seconds(core: Any, address: str) -> tuple[float, float]:
    """One more probe on each side after a sync, outside its timing: (learner s, replica s).
    The replica's adapter is loaded by then, so against the sync's own probe this shows
    what loading a new adapter cost."""
    from hybridflow.weights.client import GrpcWeightSyncClient
    from hybridflow.weights.verify import Probe

    probe = Probe.for_vocab(core.worker.vocab_size)
    start = time.perf_counter()
    core.worker.compute_logprobs([probe.prompt_ids], [probe.response_ids], 1.0)
    learner_s = time.perf_counter() - start
    client = GrpcWeightSyncClient(address)
    try:
        start = time.perf_counter()
        client.probe_logprobs(probe.prompt_ids, probe.response_ids, 60.0)
        return learner_s, time.perf_counter() - start
    finally:
        client.close()


def generation_seconds(address: str, repeats: int) -> float:
    """Median seconds of one fixed request (8 prompts x 4 samples x up to 32 tokens) on a
    replica: what serving the adapter (or the merged model) costs generation."""
    from hybridflow.services.rollout.client import GrpcRolloutClient
    from hybridflow.types import SamplingParams

    client = GrpcRolloutClient(address)
    prompts = [[5 + i, 6 + i, 7 + i, 8 + i] for i in range(8)]
    params = SamplingParams(n=4, max_new_tokens=32, temperature=1.0, seed=0)
    times = []
    for _ in range(1 + repeats):
        start = time.perf_counter()
        client.generate(prompts, params)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])  # the first warms the engine up


def run_sync(path: Path, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from benchmarks.engines.run_weight_sync_vllm import start_service, stop

    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    send: dict[str, list[float]] = {v: [] for v in VARIANTS}
    probes: dict[str, dict[str, list[float]]] = {
        v: {"learner": [], "replica": []} for v in VARIANTS
    }
    sent: dict[str, int] = {}
    procs, cores = {}, {}
    try:
        for variant in VARIANTS:
            work = tmp / variant
            work.mkdir()
            proc, address, _ = start_service(path, args.tp, work, lora_keys(variant, args.rank))
            procs[variant] = (proc, address)
            cores[variant] = learner_core(path, variant, args.rank)
            sent[variant] = cores[variant].publish_weights([procs[variant][1]]).num_bytes
        for _ in range(args.rounds):
            for variant in VARIANTS:
                core, address = cores[variant], procs[variant][1]
                for _ in range(args.syncs):
                    perturb(core.worker)
                    start = time.perf_counter()
                    report = core.publish_weights([address])
                    seconds[variant].append(time.perf_counter() - start)
                    send[variant].append(report.duration_s)  # without the probe
                    sent[variant] = report.num_bytes
                    learner_s, replica_s = probe_seconds(core, address)
                    probes[variant]["learner"].append(learner_s)
                    probes[variant]["replica"].append(replica_s)
                print(f"{variant}: {statistics.median(seconds[variant]):.3f} s/sync", flush=True)
        generation = {v: generation_seconds(procs[v][1], args.rounds) for v in VARIANTS}
    finally:
        for core in cores.values():
            core.shutdown()
        for proc, _ in procs.values():
            stop(proc)
    med = {v: statistics.median(s) for v, s in seconds.items()}
    return {
        "seconds_per_sync": med,
        "send_seconds_per_sync": {v: statistics.median(s) for v, s in send.items()},
        "probe_seconds_after_sync": {
            v: {side: statistics.median(t) for side, t in sides.items()}
            for v, sides in probes.items()
        },
        "repeats_s": seconds,
        "bytes_per_sync": sent,
        "generate_seconds": generation,
        "ratios": {f"{v}_over_full_s": med[v] / med["full"] for v in VARIANTS if v != "full"}
        | {f"{v}_over_full_bytes": sent[v] / sent["full"] for v in VARIANTS if v != "full"},
    }


def memory_child(path: str, variant: str, rank: int, samples: int, tokens: int, steps: int) -> None:
    """One variant's train steps in this (fresh) process; prints one JSON line."""
    import numpy as np
    import torch

    from hybridflow.services.learner.config import LearnerConfig
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.types import TrainSample

    torch.set_num_threads(int(os.environ.get("HF_BENCH_THREADS", "2")))
    config = LearnerConfig()
    config.update.micro_batch_size = samples
    if variant != "full":
        config.lora.rank, config.lora.alpha = rank, 2.0 * rank
    worker = LearnerWorker(config, path)
    rng = np.random.default_rng(0)
    prompt_len = tokens // 4
    batch = [
        TrainSample(
            rng.integers(4, worker.vocab_size, prompt_len).astype(np.int32),
            rng.integers(4, worker.vocab_size, tokens - prompt_len).astype(np.int32),
            np.full(tokens - prompt_len, -5.0, dtype=np.float32),
            float(i % 2),
            0,
            0,
        )
        for i in range(samples)
    ]
    built_kb = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    start = time.perf_counter()
    for _ in range(steps):
        worker.train_step(batch)
    seconds = (time.perf_counter() - start) / steps
    optim_bytes = sum(
        t.numel() * t.element_size()
        for state in worker.actor_optim.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    trainable = sum(p.numel() for p in worker.actor.parameters() if p.requires_grad)
    print(
        json.dumps(
            {
                "variant": variant,
                "built_rss_mb": built_kb / 1024,
                "peak_rss_mb": _status_kb("VmHWM") / 1024,
                "step_over_built_mb": (_status_kb("VmHWM") - built_kb) / 1024,
                "optimizer_state_mb": optim_bytes / MIB,
                "trainable_params": trainable,
                "seconds_per_step": seconds,
            }
        )
    )


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def run_memory(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows = {}
    for variant in ("full", "lora_adapter"):
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", variant, "--model-path", str(path),
             "--rank", str(args.rank), "--samples", str(args.samples),
             "--tokens", str(args.tokens), "--steps", str(args.steps)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows["full" if variant == "full" else "lora"] = row
        print(f"memory {variant}: {row}", flush=True)
    return {
        "rows": rows,
        "ratios": {
            "lora_over_full_peak_rss": rows["lora"]["peak_rss_mb"] / rows["full"]["peak_rss_mb"],
            "lora_over_full_step_over_built": rows["lora"]["step_over_built_mb"]
            / rows["full"]["step_over_built_mb"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="100m", help="100m (a Llama built here) or a model spec (builtin:tiny)"
    )
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--tp", type=int, default=1, help="TP workers of each vLLM replica")
    parser.add_argument("--syncs", type=int, default=5, help="timed syncs per variant and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8, help="memory: samples per batch")
    parser.add_argument("--tokens", type=int, default=128, help="memory: tokens per sample")
    parser.add_argument("--steps", type=int, default=2, help="memory: train steps")
    parser.add_argument("--parts", default="sync,memory")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    parser.add_argument("--memory-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        memory_child(
            args.model_path, args.memory_child, args.rank, args.samples, args.tokens, args.steps
        )
        return 0

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("HYBRIDFLOW_TOKEN", secrets.token_hex(16))
    from benchmarks.common.runner import environment
    from benchmarks.engines.run_engines import build_100m

    out = args.results / time.strftime("lora_%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "suite": "lora",
        "model": args.model,
        "rank": args.rank,
        "tp": args.tp,
    }
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.model == "100m":
            path = build_100m(tmp / "llama-100m")
        else:
            from hybridflow.models import resolve_model_path

            path = resolve_model_path(args.model)
        parts = args.parts.split(",")
        if "sync" in parts:
            summary["sync"] = run_sync(path, args, tmp)
        if "memory" in parts:
            summary["memory"] = run_memory(path, args)
    summary.update(environment())
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if "sync" in summary:
        sync = summary["sync"]
        print(
            f"\n{'variant':14} {'s/sync':>8} {'send s':>8} {'MiB/sync':>10} {'probes s':>14} "
            f"{'generate s':>10}"
        )
        for v in VARIANTS:
            after = sync["probe_seconds_after_sync"][v]
            print(
                f"{v:14} {sync['seconds_per_sync'][v]:8.3f} "
                f"{sync['send_seconds_per_sync'][v]:8.3f} {sync['bytes_per_sync'][v] / MIB:10.2f} "
                f"{after['learner']:6.3f} {after['replica']:6.3f} "
                f"{sync['generate_seconds'][v]:10.3f}"
            )
    print(
        json.dumps({k: summary[k]["ratios"] for k in ("sync", "memory") if k in summary}, indent=2)
    )
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
