"""Measure ``learner.memory``'s dtype / activation_checkpointing / cpu_offload: one GRPO step of
a 2-rank FSDP2 learner (gloo, CPU) under each setting alone, each in fresh processes.

    PYTHONPATH=$PWD python scripts/measure_learner_memory.py [--model builtin:tiny-qwen3]
        [--random-qwen2 HIDDEN,LAYERS] [--samples 8] [--prompt 32] [--response 160]
        [--micro-batch 4] [--threads 1]

Per setting, rank 0's: the peak RSS rise during the train step over the RSS just before it
(sampled every 2 ms from /proc/self/statm), the bytes saved for the backward during the step
(``torch.autograd.graph.saved_tensors_hooks``: exact, allocator-independent), the step's
seconds, and the max / mean |Δ log-prob| of ``compute_logprobs`` before the step against the
default (same weights). ``--random-qwen2 256,4`` swaps the model for a random-init Qwen2 of
that width and depth with tiny-qwen3's tokenizer. Nothing is written outside a temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "dtype=bfloat16": {"dtype": "bfloat16"},
    "activation_checkpointing": {"activation_checkpointing": True},
    "cpu_offload": {"cpu_offload": True},
}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rank(rank: int, port: int, args: dict[str, Any], memory: dict[str, Any], out: str) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args["threads"])
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch.distributed as dist

    from hybridflow.services.learner.config import (
        KLConfig,
        LearnerConfig,
        OptimizerConfig,
        TopologyConfig,
        UpdateConfig,
    )
    from hybridflow.services.learner.distributed import init_from_env
    from hybridflow.services.learner.memory_config import LearnerMemoryConfig
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.types import TrainSample

    init_from_env("cpu")
    cfg = LearnerConfig(
        algorithm="grpo",
        optimizer=OptimizerConfig(lr=1e-5),
        update=UpdateConfig(micro_batch_size=args["micro_batch"]),
        kl=KLConfig(use_reference=True, coef=0.05),
        topology=TopologyConfig(num_threads=args["threads"]),
        memory=LearnerMemoryConfig(**memory),
    )
    worker = LearnerWorker(cfg, args["model"])
    rng = np.random.default_rng(0)
    high = worker.vocab_size - 8
    samples = [
        TrainSample(
            prompt_ids=rng.integers(4, high, args["prompt"]).tolist(),
            response_ids=rng.integers(4, high, args["response"]).tolist(),
            rollout_logprobs=[-1.0] * args["response"],
            reward=float(i % 2),
            group_id=i // 4,
            policy_version=0,
        )
        for i in range(args["samples"])
    ]
    logprobs = worker.compute_logprobs(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0
    )
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    before, peak, stop = _rss(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        worker.train_step(samples)
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    if rank == 0:
        result = {
            "rss_before_mib": before / 2**20,
            "step_peak_rise_mib": max(0, peak[0] - before) / 2**20,
            "saved_for_backward_mib": saved[0] / 2**20,
            "step_s": seconds,
            "logprobs": [row.tolist() for row in logprobs],
            "params": worker.num_params,
        }
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _random_qwen2(spec: str, directory: Path) -> str:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from hybridflow.models import resolve_model_path

    hidden, layers = (int(x) for x in spec.split(","))
    base = resolve_model_path("builtin:tiny-qwen3")
    tokenizer = AutoTokenizer.from_pretrained(base)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    import torch

    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny-qwen3")
    parser.add_argument("--random-qwen2", default="")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=160)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = vars(parser.parse_args())

    import numpy as np
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        if args["random_qwen2"]:
            args["model"] = _random_qwen2(args["random_qwen2"], Path(tmp) / "qwen2")
        results: dict[str, Any] = {}
        for name, memory in SETTINGS.items():
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            out = str(Path(tmp) / f"{len(results)}.json")
            mp.start_processes(
                _rank, args=(port, args, memory, out), nprocs=2, start_method="spawn"
            )
            results[name] = json.loads(Path(out).read_text())
    want = [np.array(r) for r in results["default"]["logprobs"]]
    print(f"model {args['model']} ({results['default']['params']:,} params), 2 gloo ranks")
    print(
        f"{'setting':26} {'RSS before':>11} {'step peak +':>12} {'saved (bwd)':>12} "
        f"{'step s':>7} {'|dlogp| max':>12} {'mean':>9}"
    )
    for name, r in results.items():
        diff = np.concatenate([np.abs(np.array(a) - b) for a, b in zip(r["logprobs"], want)])
        print(
            f"{name:26} {r['rss_before_mib']:9.1f}MB {r['step_peak_rise_mib']:10.1f}MB "
            f"{r['saved_for_backward_mib']:10.1f}MB {r['step_s']:7.2f} "
            f"{diff.max():12.3g} {diff.mean():9.3g}"
        )


if __name__ == "__main__":
    main()
