"""Rollout engines side by side: the vllm engine against the hf engine, same batch, same run.

    python benchmarks/engines/run_engines.py                       # tiny + 100m, both engines
    python benchmarks/engines/run_engines.py --models tiny --repeats 1

For each model, both engines are built once in this process (vLLM's model runs in its worker
process), warmed up, then the same workloads run alternately ``--repeats`` times; the figure
is the median tokens/s (generated tokens, each completion through its EOS, over wall time of
one ``generate`` call). Workloads: the quickstart's (32 prompts x 8, 4 new tokens), and the
issue's (8 prompts x 8 = 64 sequences, 256 new tokens), plus a length sweep in between to
show where vLLM overtakes. Models: ``tiny`` is ``builtin:tiny``; ``100m`` is a random-init
Llama of the weight-sync benchmark's 100m shapes (100,449,920 parameters, fp32; random
weights almost never draw EOS, so completions run to the limit).

Both engines get the same cores (``--threads``, default: all of them) and must have the
machine alone. Writes ``results/engines_YYYYMMDD_HHMMSS/summary.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

WORKLOADS = {
    # name: (prompts, n, max_new_tokens)
    "quickstart 32x8, 4 tok": (32, 8, 4),
    "64 seqs, 16 tok": (8, 8, 16),
    "64 seqs, 64 tok": (8, 8, 64),
    "64 seqs, 256 tok": (8, 8, 256),
}


def build_100m(out_dir: Path) -> Path:
    """A random-init Llama with the weight-sync benchmark's 100m shapes, saved HF-style."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.weight_sync.models import get_model
    from hybridflow.models.tokenizer import build_char_tokenizer

    dims = get_model("100m").dims
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=dims.vocab,
        hidden_size=dims.hidden,
        intermediate_size=dims.intermediate,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_heads,
        num_key_value_heads=dims.num_kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=dims.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).float().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def prompts_for(model_path: Path, num: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from hybridflow.data.arith import make_arith_rows

    tok = AutoTokenizer.from_pretrained(str(model_path))
    rows = make_arith_rows(num, seed=1234)
    return [tok.encode(r["prompt"], add_special_tokens=False) for r in rows]


def tokens_per_s(engine: Any, prompts: list[list[int]], n: int, max_new: int) -> float:
    from hybridflow.types import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=1.0, n=n, max_new_tokens=max_new, seed=1)
    start = time.perf_counter()
    groups = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(c.token_ids) for g in groups for c in g) / elapsed


def bench_model(
    name: str, path: Path, threads: int, repeats: int, device: str = "cpu"
) -> dict[str, Any]:
    import torch

    from hybridflow.services.rollout.engine import HFEngine
    from hybridflow.services.rollout.vllm_engine import VLLMEngine

    torch.set_num_threads(threads)
    start = time.perf_counter()
    engines: dict[str, Any] = {"hf": HFEngine(path, device=device)}
    load_s = {"hf": time.perf_counter() - start}
    start = time.perf_counter()
    engines["vllm"] = VLLMEngine(path, device=device, num_threads=threads, kv_cache_gib=2)
    load_s["vllm"] = time.perf_counter() - start
    max_len = engines["vllm"].max_model_len
    rates: dict[str, dict[str, list[float]]] = {}
    for workload, (num_prompts, n, max_new) in WORKLOADS.items():
        prompts = prompts_for(path, num_prompts)
        if max(map(len, prompts)) + max_new > max_len:
            print(f"[{name}] {workload}: skipped (longer than the model's {max_len} positions)")
            continue
        rates[workload] = {e: [] for e in engines}
        for engine in engines.values():  # warm-up (vLLM's first batch of a shape is slow)
            tokens_per_s(engine, prompts, n, min(max_new, 8))
        for _ in range(repeats):
            for label, engine in engines.items():
                rates[workload][label].append(tokens_per_s(engine, prompts, n, max_new))
                print(f"[{name}] {workload} {label}: {rates[workload][label][-1]:.0f} tok/s")
    engines["vllm"].close()
    figures = {}
    for workload, by_engine in rates.items():
        med = {e: statistics.median(v) for e, v in by_engine.items()}
        figures[workload] = {
            "hf_tokens_per_s": med["hf"],
            "vllm_tokens_per_s": med["vllm"],
            "vllm_over_hf": med["vllm"] / med["hf"],
            "repeats": by_engine,
        }
    return {"load_s": load_s, "workloads": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="tiny,100m", help="comma list: tiny, 100m")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed runs")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)

    from benchmarks.common.runner import environment
    from hybridflow.models import resolve_model_path

    out = args.results / time.strftime("engines_%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "suite": "engines",
        "threads": args.threads,
        "device": args.device,
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name == "tiny":
                path = resolve_model_path("builtin:tiny")
            elif name == "100m":
                path = build_100m(Path(tmp) / "llama-100m")
            else:
                parser.error(f"unknown model {name!r}")
            summary["models"][name] = bench_model(
                name, path, args.threads, args.repeats, args.device
            )
    summary.update(environment())
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{'model':6} {'workload':24} {'hf tok/s':>10} {'vllm tok/s':>11} {'vllm/hf':>8}")
    for name, fig in summary["models"].items():
        for workload, w in fig["workloads"].items():
            print(
                f"{name:6} {workload:24} {w['hf_tokens_per_s']:10.0f} "
                f"{w['vllm_tokens_per_s']:11.0f} {w['vllm_over_hf']:8.2f}"
            )
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
