"""The oracle's figures: how far hybridflow's update is from TRL's, per setting.

    python -m tests.oracle.figures

One row per comparison of ``test_trl_step.py`` and ``test_trl_preference.py``: the largest
absolute difference of the advantages, the loss, the gradient norm, the clipped gradients and
the weights after AdamW (all weights; those the tests hold to 1e-6 per step; the steep ones,
whose AdamW denominator fell below ``compare.STEEP``: how many, and their largest difference);
DPO, KTO and ORPO after their second step.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from hybridflow.preference.config import PreferenceConfig
from tests.helpers import build_tiny_checkpoint
from tests.oracle.compare import adam_denominators, both_sides_floor, split_diffs
from tests.oracle.trl_oracle import StepResult, example_batch, our_step, trl_step
from tests.oracle.trl_preference import (
    example_labelled,
    example_pairs,
    our_preference_steps,
    trl_dpo_steps,
    trl_kto_steps,
    trl_orpo_steps,
)

LR = 1e-3
CASES = [
    ("grpo bnpo/group", {"loss_type": "bnpo"}, {}),
    ("grpo dapo/group", {"loss_type": "dapo"}, {}),
    ("grpo grpo/group", {"loss_type": "grpo"}, {"loss_agg_mode": "seq-mean-token-mean"}),
    ("grpo bnpo/none", {"loss_type": "bnpo", "scale_rewards": "none"},
     {"norm_adv_by_std": False}),
    ("grpo bnpo/batch", {"loss_type": "bnpo", "scale_rewards": "batch"},
     {"advantage_estimator": "grpo_batch_std"}),
    ("rloo", {"trainer": "rloo"},
     {"advantage_estimator": "rloo", "loss_agg_mode": "seq-mean-token-sum"}),
]  # fmt: skip


def _row(name: str, trl: StepResult, ours: StepResult, adv: bool = True, steps: int = 1) -> str:
    worst = max(abs(a - b) for a, b in zip(trl.advantages, ours.advantages)) if adv else None
    grad = max(float((trl.grads[k] - ours.grads[k]).abs().max()) for k in trl.grads)
    floor = both_sides_floor(adam_denominators(trl.grad_steps), adam_denominators(ours.grad_steps))
    weights = max(float((ours.params[k] - v).abs().max()) for k, v in trl.params.items())
    tight, steep, num_steep = split_diffs(trl.params, ours.params, floor[-1])
    total = sum(v.numel() for v in trl.params.values())
    loss = abs(trl.loss - ours.loss)
    return (
        f"| {name} | {'-' if worst is None else f'{worst:.1e}'} | {loss:.1e} "
        f"| {abs(trl.grad_norm - ours.grad_norm):.1e} | {grad:.1e} | {weights:.1e} "
        f"| {tight:.1e} | {num_steep} ({100 * num_steep / total:.2f}%), {steep:.1e} |"
    )


def main() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp())
    model = build_tiny_checkpoint(root / "model")
    batch = example_batch()
    print("| setting | advantages | loss | grad norm | clipped grads | weights | "
          "weights held to 1e-6 per step | steep weights: count, largest difference |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, trl_config, our_config in CASES:
        trl = trl_step(
            model, batch, root / "trl", learning_rate=1e-3, max_completion_length=8,
            max_grad_norm=0.5, weight_decay=0.0, **trl_config,
        )  # fmt: skip
        ours = our_step(
            model, batch, lr=1e-3, grad_clip=0.5, weight_decay=0.0, norm_adv_eps=1e-4,
            **our_config,
        )  # fmt: skip
        print(_row(name, trl, ours), flush=True)
    pairs = example_pairs()
    for loss_type in ("sigmoid", "hinge", "ipo"):
        trl = trl_dpo_steps(
            model, pairs, root / "dpo", beta=0.1, loss_type=[loss_type], learning_rate=1e-3,
            max_grad_norm=0.5, weight_decay=0.0,
        )  # fmt: skip
        ours = our_preference_steps(
            model, pairs, PreferenceConfig(loss="dpo", beta=0.1, dpo_loss_type=loss_type),
            lr=1e-3, grad_clip=0.5, weight_decay=0.0,
        )  # fmt: skip
        print(_row(f"dpo {loss_type} (step 2)", trl, ours, adv=False, steps=2), flush=True)
    rows = example_labelled()
    for desirable, undesirable in ((1.0, 1.0), (1.0, 1.33)):
        trl = trl_kto_steps(
            model, rows, root / "kto", beta=0.1, desirable_weight=desirable,
            undesirable_weight=undesirable, learning_rate=1e-3, max_grad_norm=0.5,
            weight_decay=0.0,
        )  # fmt: skip
        ours = our_preference_steps(
            model, rows, PreferenceConfig(loss="kto", beta=0.1, desirable_weight=desirable,
                                          undesirable_weight=undesirable),
            lr=1e-3, grad_clip=0.5, weight_decay=0.0,
        )  # fmt: skip
        name = f"kto weights {desirable:g}/{undesirable:g} (step 2)"
        print(_row(name, trl, ours, adv=False, steps=2), flush=True)
    trl = trl_orpo_steps(
        model, pairs, root / "orpo", beta=0.5, learning_rate=1e-3, max_grad_norm=0.5,
        weight_decay=0.0,
    )  # fmt: skip
    ours = our_preference_steps(
        model, pairs, PreferenceConfig(loss="orpo", orpo_lambda=0.5, orpo_nll_prompt=True),
        lr=1e-3, grad_clip=0.5, weight_decay=0.0, use_reference=False,
    )  # fmt: skip
    print(_row("orpo lambda 0.5, NLL with prompt (step 2)", trl, ours, adv=False, steps=2))


if __name__ == "__main__":
    main()
