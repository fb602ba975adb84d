"""The oracle's figures: how far hybridflow's update is from TRL's, per setting.

    python -m tests.oracle.figures [--steps 20]

One row per comparison of ``test_trl_step.py`` and ``test_trl_preference.py``: the largest
absolute difference of the advantages, the loss, the gradient norm, the clipped gradients and
the weights after AdamW (all weights; those the tests hold to 1e-6 per step; the steep ones,
whose AdamW denominator fell below ``compare.STEEP``: how many, and their largest difference);
DPO, KTO and ORPO after their second step. Then ``test_trl_trajectory.py``'s twenty GRPO
steps: per step, TRL's gradient norm, the same differences of the weights, ours against ours
with the rows in the batch's order, and each planted change of one setting (the largest
difference of the weights held to 1e-6); ``--steps`` runs that schedule longer (a row every
step up to 20, then every 20th). Then the first step's gradients with TRL's log-prob head and
with a plain one in its place.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path
from types import MethodType, SimpleNamespace
from typing import Any

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
from tests.oracle.trl_trajectory import (
    PLANTED,
    Trajectory,
    example_schedule,
    matched,
    max_weight_diffs,
    our_steps,
    trl_defaults,
    trl_steps,
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of the trajectory table")
    num_steps = parser.parse_args(argv).steps
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
    _trajectory(model, root, num_steps)
    _first_step_gradients(model, root)


def _tight(a: Trajectory, b: Trajectory) -> list[float]:
    floors = both_sides_floor(adam_denominators(a.grads), adam_denominators(b.grads))
    return [split_diffs(x, y, f)[0] for x, y, f in zip(a.params, b.params, floors)]


def _trajectory(model: Path, root: Path, num_steps: int) -> None:
    schedule = example_schedule(num_steps)
    args = trl_defaults(root / "defaults")
    trl = trl_steps(model, schedule, root / "trajectory", learning_rate=LR)
    ours = our_steps(model, schedule, trl.orders, **matched(args, LR))
    reordered = our_steps(model, schedule, [list(range(12))] * num_steps, **matched(args, LR))
    floors = both_sides_floor(adam_denominators(trl.grads), adam_denominators(ours.grads))
    print(
        "\n| step | TRL's grad norm | weights | held to 1e-6 | steep | ours reordered: weights, held |"
    )
    print("|---|---|---|---|---|---|")
    diffs, self_diffs = max_weight_diffs(trl, ours), max_weight_diffs(ours, reordered)
    self_tight = _tight(ours, reordered)
    for step in [*range(min(num_steps, 20)), *range(39, num_steps, 20)]:
        tight, _, steep = split_diffs(trl.params[step], ours.params[step], floors[step])
        clipped = " (clipped)" if trl.grad_norms[step] > args.max_grad_norm else ""
        print(
            f"| {step + 1} | {trl.grad_norms[step]:.3f}{clipped} | {diffs[step]:.1e} | {tight:.1e} "
            f"| {steep} | {self_diffs[step]:.1e}, {self_tight[step]:.1e} |"
        )
    shown = [s for s in (0, 1, 9, 19) if s < num_steps]
    print("\n| planted on our side | " + " | ".join(f"step {s + 1}" for s in shown) + " |")
    print("|---|" + "---|" * len(shown))
    for name, changes in PLANTED.items():
        tight = _tight(trl, our_steps(model, schedule, trl.orders, **matched(args, LR, **changes)))
        print(f"| {name} | " + " | ".join(f"{tight[s]:.1e}" for s in shown) + " |")


def _plain_head(model: torch.nn.Module) -> None:
    """In place of TRL's ``add_fused_lm_head`` (its chunked log-prob head with its own
    backward): the model's own logits, ``log_softmax`` and a gather, under autograd."""
    forward = type(model).forward.__get__(model)

    def fused(
        self: torch.nn.Module,
        *args: Any,
        fused_lm_head: bool = False,
        labels: Any = None,
        **kw: Any,
    ) -> Any:
        if not fused_lm_head:
            return forward(*args, labels=labels, **kw)
        logprobs = forward(*args, **kw, use_cache=False).logits[:, :-1].log_softmax(-1)
        target = labels[:, 1:]
        picked = logprobs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        entropy = -(logprobs.exp() * logprobs).sum(-1)
        return SimpleNamespace(log_probs=picked.masked_fill(target == -100, 0), entropy=entropy)

    model.forward = MethodType(fused, model)  # type: ignore[method-assign]


def _first_step_gradients(model: Path, root: Path) -> None:
    """Where the twenty steps' difference starts: the first step's gradients, on equal
    weights, with TRL's log-prob head and with a plain one in its place."""
    from trl.trainer import grpo_trainer  # after main's warning filter, like the drivers'

    fused_head = grpo_trainer.add_fused_lm_head
    schedule = example_schedule(1)
    args = trl_defaults(root / "defaults")
    print("\n| TRL's log-prob head | gradient elements bit-equal to ours | largest difference |")
    print("|---|---|---|")
    for name in ("its fused chunked head", "plain autograd head"):
        if name == "plain autograd head":
            grpo_trainer.add_fused_lm_head = lambda m, *_, **__: _plain_head(m)  # type: ignore[attr-defined]
        try:
            trl = trl_steps(model, schedule, root / "first", learning_rate=LR)
        finally:
            grpo_trainer.add_fused_lm_head = fused_head
        ours = our_steps(model, schedule, trl.orders, **matched(args, LR))
        diffs = torch.cat([(ours.grads[0][k] - g).abs().flatten() for k, g in trl.grads[0].items()])
        share = float((diffs == 0).double().mean())
        print(f"| {name} | {100 * share:.0f}% | {float(diffs.max()):.1e} |")


if __name__ == "__main__":
    main()
