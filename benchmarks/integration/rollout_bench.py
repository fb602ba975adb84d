"""Rollout engine tokens/s: ``HFEngine.generate`` against plain ``model.generate``.

Same checkpoint, same prompts (left-padded, every prompt repeated ``n`` times), same
sampling (temperature 1, no top-k / top-p truncation) and the same ``max_new_tokens``; both
stop once every row has drawn EOS. Tokens count what each row generated up to and including
its EOS. The engine also returns per-token log-probs, ``generate`` here does not.
Knows the engine's public API and transformers; nothing of services.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from benchmarks.integration.config import RolloutBench
from benchmarks.integration.timing import DetailedLog, stats, timed


def _prompts(tokenizer: Any, num: int) -> list[list[int]]:
    from hybridflow.data.arith import make_arith_rows

    rows = make_arith_rows(num, seed=1234)
    return [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows]


def _hf_generate(model: Any, rows: list[list[int]], max_new: int, pad: int, eos: int) -> int:
    """One plain generate call; returns the generated tokens (through each row's EOS)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new,
            pad_token_id=pad,
            eos_token_id=eos,
        )
    new = out[:, width:]
    total = 0
    for row in new.tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def run(cfg: RolloutBench, model_path: Path, log: DetailedLog) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from hybridflow.services.rollout.engine import HFEngine
    from hybridflow.types import SamplingParams

    engine = HFEngine(model_path, seed=0)
    prompts = _prompts(engine.tokenizer, cfg.prompts)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=cfg.max_new_tokens, n=cfg.n)

    def engine_call() -> int:
        groups = engine.generate(prompts, params)
        return sum(len(c.token_ids) for g in groups for c in g)

    eng_s, eng_tokens = timed(
        engine_call, cfg.repeats, cfg.warmup, log, "rollout", "hf_engine",
        lambda tokens: {"tokens": tokens},
    )  # fmt: skip

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.eval()
    rows = [p for p in prompts for _ in range(cfg.n)]
    pad, eos = engine.pad_token_id, engine.eos_token_id
    hf_s, hf_tokens = timed(
        lambda: _hf_generate(model, rows, cfg.max_new_tokens, pad, eos),
        cfg.repeats, cfg.warmup, log, "rollout", "transformers_generate",
        lambda tokens: {"tokens": tokens},
    )  # fmt: skip

    engine_tps = sum(eng_tokens) / sum(eng_s)
    hf_tps = sum(hf_tokens) / sum(hf_s)
    return {
        "batch_rows": len(rows),
        "max_new_tokens": cfg.max_new_tokens,
        "hf_engine": {
            **stats(eng_s),
            "tokens": sum(eng_tokens),
            "tokens_per_s": engine_tps,
            "mean_tokens_per_row": sum(eng_tokens) / (len(rows) * cfg.repeats),
        },
        "transformers_generate": {
            **stats(hf_s),
            "tokens": sum(hf_tokens),
            "tokens_per_s": hf_tps,
            "mean_tokens_per_row": sum(hf_tokens) / (len(rows) * cfg.repeats),
        },
        "engine_over_transformers_tokens_per_s": engine_tps / hf_tps if hf_tps else 0.0,
    }
