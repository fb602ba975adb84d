"""What fits into a memory budget, per memory setting, from a ``run_memory.py`` result.

A learner's resident memory during a train step is, for P parameters:

* the model state, held whatever the batch: fp32 weights (4 B), fp32 gradients (4 B) and
  AdamW's two fp32 moments (8 B): 16 B per parameter in every setting here (bf16 keeps
  fp32 master weights, gradients and moments: docs/learner-memory.md), plus the runtime
  (Python, torch, transformers);
* the step's activations and logits, which grow with the positions of the largest
  micro-batch (real tokens when packed, rows x longest when padded).

``run_memory.py`` measures the step's peak over the model's resident size (gradients
included, no optimizer state) at one batch. This script takes each setting's activation
cost per position of its largest micro-batch from that and answers, for the measured model
and a ``--budget-gib`` machine:

* the largest micro-batch (positions) that fits beside the model state;
* the largest model of the same shape family (scaled layers, same width and vocabulary) that
  fits with the measured micro-batch: the per-layer part of the activation cost scales with
  the layers, the rest (logits, head) does not.

The per-layer part of the activation cost comes from two measurements of the same setting
at two layer counts (``--small`` and ``--large``, same tokens and micro-batches): the
difference per layer. Both answers are linear extrapolations: attention's score matrices
(the math sdpa path on CPU, packed rows most of all) grow with the square of a row's length,
so the largest micro-batch is an upper estimate for long packed rows.

    python benchmarks/learner_memory/fit_memory.py --small l2.json --large l24.json
        [--budget-gib 24]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

STATE_BYTES_PER_PARAM = 16  # fp32 weights + gradients + AdamW moments
GB = 1e9


def model_params(layers: int) -> int:
    """Parameters of the Qwen2.5-0.5B shape with ``layers`` decoder layers (tied head)."""
    from hybridflow.models.shapes import QWEN25_05B

    d = QWEN25_05B.dims
    hidden, inter, vocab = d["hidden_size"], d["intermediate_size"], d["vocab_size"]
    head_dim = hidden // d["num_attention_heads"]
    kv = d["num_key_value_heads"] * head_dim
    attention = hidden * hidden * 2 + hidden * kv * 2 + hidden + kv * 2  # q, o, k, v (+ biases)
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    return vocab * hidden + layers * per_layer + hidden


def positions(result: dict[str, Any]) -> int:
    """Positions of the setting's largest micro-batch: its tensors' size."""
    return int(result["largest_micro_batch_positions"])


def activation_bytes(result: dict[str, Any]) -> float:
    """The step's peak over the model, less the fp32 gradients: activations and logits."""
    return float(result["step_peak_over_model_mb"]) * 1e6 - 4 * model_params(int(result["layers"]))


def fit(small: dict[str, Any], large: dict[str, Any], budget_gb: float) -> dict[str, Any]:
    """Largest micro-batch and largest model for one setting, from its two measurements."""
    layers = int(large["layers"])
    params = model_params(layers)
    runtime = float(large["model_rss_mb"]) * 1e6 - 4 * params  # RSS beyond the fp32 weights
    per_pos_large = activation_bytes(large) / positions(large)
    per_pos_small = activation_bytes(small) / positions(small)
    per_layer_pos = (per_pos_large - per_pos_small) / (layers - int(small["layers"]))
    fixed_pos = per_pos_large - layers * per_layer_pos  # logits, head, embeddings
    state = STATE_BYTES_PER_PARAM * params + runtime
    max_positions = int((budget_gb * GB - state) / per_pos_large)
    batch = positions(large)
    per_layer_params = model_params(layers + 1) - params
    room = budget_gb * GB - runtime - STATE_BYTES_PER_PARAM * model_params(0) - fixed_pos * batch
    max_layers = int(room / (STATE_BYTES_PER_PARAM * per_layer_params + per_layer_pos * batch))
    return {
        "setting": large["setting"],
        "measured_positions": batch,
        "mb_per_position": round(per_pos_large / 1e6, 3),
        "kb_per_layer_position": round(per_layer_pos / 1e3, 1),
        "model_state_gb": round(state / GB, 2),
        "max_micro_batch_positions": max_positions,
        "max_layers": max_layers,
        "max_params_b": round(model_params(max_layers) / 1e9, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=Path, required=True, help="run_memory.py --out, few layers")
    parser.add_argument("--large", type=Path, required=True, help="the same, more layers")
    parser.add_argument("--budget-gib", type=float, default=24.0)
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON")
    args = parser.parse_args()
    small = {r["setting"]: r for r in json.loads(args.small.read_text())}
    large = {r["setting"]: r for r in json.loads(args.large.read_text())}
    budget_gb = args.budget_gib * 2**30 / GB
    rows = [fit(small[name], large[name], budget_gb) for name in large if name in small]
    print(
        f"{'setting':14s} {'MB/pos':>7s} {'KB/layer/pos':>12s} {'state GB':>8s}"
        f" {'max positions':>13s} {'max layers':>10s} {'params':>7s}"
    )
    for f in rows:
        print(
            f"{f['setting']:14s} {f['mb_per_position']:7.3f} {f['kb_per_layer_position']:12.1f}"
            f" {f['model_state_gb']:8.2f} {f['max_micro_batch_positions']:13d}"
            f" {f['max_layers']:10d} {f['max_params_b']:6.2f}B"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
