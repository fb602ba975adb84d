"""The oracle's figures: how far hybridflow's update is from TRL's, per setting.

    python -m tests.oracle.figures

One row per comparison of ``test_trl_step.py``: the largest absolute difference of the
advantages, the loss, the gradient norm, the clipped gradients and the weights after AdamW
(all weights, and those the test holds to about 1e-6: see ``compare.assert_same_update``); DPO after its second
step.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from hybridflow.preference.config import PreferenceConfig
from tests.helpers import build_tiny_checkpoint
from tests.oracle.compare import TOL, weight_bounds
from tests.oracle.trl_oracle import StepResult, example_batch, our_step, trl_step
from tests.oracle.trl_preference import (
    example_labelled,
    example_pairs,
    our_preference_steps,
    trl_dpo_steps,
    trl_kto_steps,
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
    weights = well = 0.0
    tight = total = 0
    for k, want in trl.params.items():
        diff = (ours.params[k] - want).abs()
        weights = max(weights, float(diff.max()))
        total += diff.numel()
        if k in trl.smallest:
            ok = weight_bounds(trl.smallest[k], LR, steps) <= 2 * TOL
            tight += int(ok.sum())
            diff = diff[ok]
        well = max(well, float(diff.max()) if diff.numel() else 0.0)
    loss = abs(trl.loss - ours.loss)
    return (
        f"| {name} | {'-' if worst is None else f'{worst:.1e}'} | {loss:.1e} | {abs(trl.grad_norm - ours.grad_norm):.1e} "
        f"| {grad:.1e} | {weights:.1e} | {well:.1e} | {100 * tight / total:.0f}% |"
    )


def main() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp())
    model = build_tiny_checkpoint(root / "model")
    batch = example_batch()
    print("| setting | advantages | loss | grad norm | clipped grads | weights | "
          "weights held to ~1e-6 | share held to ~1e-6 |")  # fmt: skip
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


if __name__ == "__main__":
    main()
