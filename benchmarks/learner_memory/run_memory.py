"""The learner's memory tools (``learner.memory``): peak RSS and tokens/s of one forward +
backward over a fixed batch, per setting, each in a fresh process.

The model has Qwen2.5-0.5B's dims (``hybridflow.models.shapes.QWEN25_05B``: vocab 151,936,
hidden 896, tied embeddings) but ``--layers`` decoder layers, random init, fp32 on CPU: the
logits, not the layers, are what the log-prob tools act on. The batch is ``--tokens`` real
tokens of seeded random prompt/response lengths. Each setting runs the learner's own path
(``plan_step_micro_batches``, ``build_batch``, ``policy_forward``) with a token-mean loss of
the log-probs and entropy, ``backward`` per micro-batch as the actor update does:

* ``baseline``: ``--micro-batch-size`` right-padded rows, whole logits (``full_logits``: every
  position's, as the learner computed them before the head ran on response positions only);
* ``response_head``: the head on the response positions only, at once (the default now);
* ``chunked``: ``logprob_chunk_tokens = --chunk``;
* ``packed``: ``packing``;
* ``token_budget``: ``max_tokens_per_micro_batch = --budget`` (padded rows);
* ``logprob_tools``: the three above together;
* ``bf16``: ``dtype: bfloat16`` as a single-process learner runs it (autocast over the fp32
  parameters; a sharded learner all-gathers in bf16 instead);
* ``checkpointing``: ``activation_checkpointing`` (every decoder layer recomputed in the
  backward);
* ``all``: the five together. ``cpu_offload`` is not a setting here: on a CPU learner the
  parameters already live in host memory and it changes nothing (docs/learner-memory.md).

Peak RSS is the process's ``VmHWM``, reset (``/proc/self/clear_refs``) after the model is
built, so it is the step's peak over the model's resident size; ``model_rss_mb`` is that size.

    python benchmarks/learner_memory/run_memory.py [--tokens 4096] [--layers 2] [--threads 1]
        [--settings baseline,chunked,packed,token_budget,all] [--out results.json]

Run it on an otherwise idle machine: RSS and tokens/s are meaningless next to other jobs.
The defaults hold a baseline micro-batch of about 4 x 600 positions x 151,936 fp32 logits
(1.5 GB, several copies of it in the backward): have 16 GB free.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SETTINGS: dict[str, dict[str, bool]] = {
    "baseline": {"full": True},
    "response_head": {},
    "chunked": {"chunk": True},
    "packed": {"packing": True},
    "token_budget": {"budget": True},
    "logprob_tools": {"chunk": True, "packing": True, "budget": True},
    "bf16": {"bf16": True},
    "checkpointing": {"checkpointing": True},
    "all": {"chunk": True, "packing": True, "budget": True, "bf16": True, "checkpointing": True},
}


def _lengths(tokens: int, seed: int) -> tuple[list[int], list[int]]:
    """Seeded prompt (32-128) and response (16-512) lengths whose sum is ``tokens``."""
    import random

    rng = random.Random(seed)
    prompts: list[int] = []
    responses: list[int] = []
    left = tokens
    while left > 0:
        p = min(rng.randint(32, 128), max(left - 1, 1))
        r = max(min(rng.randint(16, 512), left - p), 1)
        prompts.append(p)
        responses.append(r)
        left -= p + r
    return prompts, responses


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One setting in this process: the measurements as a dict."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hybridflow.models.shapes import QWEN25_05B
    from hybridflow.services.learner.batch_plans import plan_step_micro_batches
    from hybridflow.services.learner.batching import build_batch
    from hybridflow.services.learner.forward import policy_forward
    from hybridflow.services.learner.models import decoder_layer_classes
    from hybridflow.services.learner.precision import autocast_forward, checkpoint_layers

    torch.set_num_threads(args.threads)
    flags = SETTINGS[name]
    started = time.perf_counter()
    torch.manual_seed(0)
    config = Qwen2Config(**{**QWEN25_05B.dims, "num_hidden_layers": args.layers})
    model = Qwen2ForCausalLM(config).float().eval()
    if flags.get("checkpointing"):  # before autocast, as the learner applies them
        checkpoint_layers(model, decoder_layer_classes(model))
    if flags.get("bf16"):
        autocast_forward(model, "cpu")
    build_s = time.perf_counter() - started
    vocab = config.vocab_size
    prompt_lens, response_lens = _lengths(args.tokens, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in prompt_lens]
    responses = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in response_lens]
    lengths = [p + r for p, r in zip(prompt_lens, response_lens, strict=True)]
    plan = plan_step_micro_batches(
        [list(range(len(lengths)))],
        0,
        args.micro_batch_size,
        0,
        lengths,
        args.budget if flags.get("budget") else 0,
    )
    chunk: int | None = args.chunk if flags.get("chunk") else (None if flags.get("full") else 0)
    num_tokens = float(sum(response_lens))

    def step() -> float:
        model.zero_grad(set_to_none=True)
        total = 0.0
        for micro in plan:
            batch = build_batch(
                [prompts[i] for i in micro.indices],
                [responses[i] for i in micro.indices],
                0,
                torch.device("cpu"),
                micro.weights,
                packed=bool(flags.get("packing")),
            )
            logp, entropy = policy_forward(model, batch, 1.0, True, chunk)
            assert entropy is not None
            loss = -((logp + 0.01 * entropy) * batch.response_mask).sum() / num_tokens
            loss.backward()
            total += float(loss)
        return total

    model_rss_kb = _status_kb("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    loss = step()
    step_s = time.perf_counter() - t0
    peak_kb = _status_kb("VmHWM")
    return {
        "setting": name,
        "layers": args.layers,
        "vocab": vocab,
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "micro_batches": len(plan),
        "largest_micro_batch_tokens": max(sum(lengths[i] for i in m.indices) for m in plan),
        "largest_micro_batch_positions": max(
            sum(lengths[i] for i in m.indices)
            if flags.get("packing")
            else len(m.indices) * max(lengths[i] for i in m.indices)
            for m in plan
        ),
        "loss": loss,
        "model_rss_mb": round(model_rss_kb / 1024, 1),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "step_peak_over_model_mb": round((peak_kb - model_rss_kb) / 1024, 1),
        "peak_reset": reset,
        "step_s": round(step_s, 3),
        "tokens_per_s": round(sum(lengths) / step_s, 1),
        "model_build_s": round(build_s, 2),
        "threads": args.threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="real tokens in the batch")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--budget", type=int, default=2048, help="max_tokens_per_micro_batch")
    parser.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_tokens")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one, args)))
        return
    names = [n for n in args.settings.split(",") if n]
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {sorted(SETTINGS)}")
    results = []
    passthrough = [
        f"--{key.replace('_', '-')}={getattr(args, key)}"
        for key in ("tokens", "layers", "micro_batch_size", "budget", "chunk", "threads", "seed")
    ]
    for name in names:
        done = subprocess.run(
            [sys.executable, __file__, *passthrough, "--one", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"setting {name}: exit {done.returncode}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(
            f"{name:13s} micro-batches {result['micro_batches']:3d}  peak RSS "
            f"{result['peak_rss_mb']:8.1f} MB (step +{result['step_peak_over_model_mb']:8.1f})"
            f"  {result['tokens_per_s']:9.1f} tokens/s  loss {result['loss']:.6f}",
            flush=True,
        )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
