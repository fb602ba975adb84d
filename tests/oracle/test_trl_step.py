"""One hybridflow GRPO (RLOO) update equals one update of TRL's ``GRPOTrainer``
(``RLOOTrainer``), TRL 1.16 as the outside oracle: same weights, prompts, completions and
rewards. In fp32 the advantages, the loss and the gradient norm agree within 1e-6, the clipped
gradients within 1e-7, and the weights after AdamW within 1e-6 but for the 8 to 13 of the tiny
Llama's 25,056 whose gradient is below 10 times AdamW's eps, where AdamW's step is steep in
the gradient and a rounding difference of 1e-10 moves the weight by up to 4.3e-5; those are
held to what two AdamW steps can differ by, and at least 99% of the weights must be held to
1e-6 (``compare.py``). Measured: the others within 7.4e-8. Twenty steps in a row:
``test_trl_trajectory.py``.

TRL's ``loss_type`` against our settings:

| TRL | hybridflow |
|---|---|
| ``bnpo``, ``dapo`` (one micro-batch) | ``loss_agg_mode: token-mean`` |
| ``grpo`` | ``loss_agg_mode: seq-mean-token-mean`` |
| ``dr_grpo`` | ``loss_agg_mode: seq-mean-token-sum``, times ``max_completion_length`` (below) |

and ``scale_rewards``: ``group`` is our ``grpo`` estimator, ``none`` is ``norm_adv_by_std:
false``, ``batch`` is the ``grpo_batch_std`` estimator. TRL adds 1e-4 to the std, verl and we
1e-6 (``learner.advantage.norm_eps``); the comparisons set ours to TRL's. The differences by design
are tests of their own: the epsilon, Dr. GRPO's constant divisor, and which weights AdamW
decays. How TRL is driven, and why that is faithful: ``tests/oracle/trl_oracle.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import build_tiny_checkpoint
from tests.oracle.compare import (
    GRAD_TOL,
    TOL,
    adam_denominators,
    assert_same_update,
    assert_weights_close,
    both_sides_floor,
    max_param_diff,
    split_diffs,
)
from tests.oracle.trl_oracle import Batch, StepResult, example_batch, our_step, trl_step

MAX_COMPLETION = 8
LR = 1e-3
CLIP = 0.5  # below the batch's gradient norm: clipping binds


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("oracle_llama"))


@pytest.fixture(scope="module")
def batch() -> Batch:
    return example_batch()


def _trl(model_dir: Path, batch: Batch, tmp_path: Path, **config: Any) -> StepResult:
    config.setdefault("max_grad_norm", CLIP)
    config.setdefault("weight_decay", 0.0)
    return trl_step(
        model_dir, batch, tmp_path / "trl", learning_rate=LR,
        max_completion_length=MAX_COMPLETION, **config,
    )  # fmt: skip


def _ours(model_dir: Path, batch: Batch, **config: Any) -> StepResult:
    config.setdefault("grad_clip", CLIP)
    config.setdefault("weight_decay", 0.0)
    config.setdefault("norm_adv_eps", 1e-4)
    return our_step(model_dir, batch, lr=LR, **config)


@pytest.mark.parametrize(
    ("loss_type", "scale_rewards", "ours"),
    [
        ("bnpo", "group", {"loss_agg_mode": "token-mean"}),
        ("dapo", "group", {"loss_agg_mode": "token-mean"}),
        ("grpo", "group", {"loss_agg_mode": "seq-mean-token-mean"}),
        ("bnpo", "none", {"norm_adv_by_std": False}),
        ("bnpo", "batch", {"advantage_estimator": "grpo_batch_std"}),
        ("grpo", "batch", {"advantage_estimator": "grpo_batch_std",
                           "loss_agg_mode": "seq-mean-token-mean"}),
    ],
)  # fmt: skip
def test_one_grpo_update_equals_trls(
    model_dir: Path, batch: Batch, tmp_path: Path, loss_type: str, scale_rewards: str, ours: Any
) -> None:
    trl = _trl(model_dir, batch, tmp_path, loss_type=loss_type, scale_rewards=scale_rewards)
    mine = _ours(model_dir, batch, **ours)
    if scale_rewards != "none":  # unscaled advantages of these rewards give a norm of 0.42
        assert trl.grad_norm > CLIP, "clipping must bind here, or it goes untested"
    assert_same_update(trl, mine, LR)


def test_unclipped_update_equals_trls(model_dir: Path, batch: Batch, tmp_path: Path) -> None:
    trl = _trl(model_dir, batch, tmp_path, loss_type="bnpo", max_grad_norm=1e9)
    assert_same_update(trl, _ours(model_dir, batch, grad_clip=1e9), LR)


def test_only_the_weight_check_sees_a_one_percent_larger_step(
    model_dir: Path, batch: Batch, tmp_path: Path
) -> None:
    """A learning rate 1% larger (1.01e-3) leaves the gradients as they were, so only the
    weights can tell: AdamW's first step is about lr long, and a weight held to 1e-6 moves
    1e-5 further, ten times the bound."""
    trl = _trl(model_dir, batch, tmp_path, loss_type="bnpo")
    mine = our_step(
        model_dir, batch, lr=1.01 * LR, grad_clip=CLIP, weight_decay=0.0, norm_adv_eps=1e-4
    )
    for name, grad in trl.grads.items():
        torch.testing.assert_close(mine.grads[name], grad, rtol=0, atol=GRAD_TOL, msg=name)
    floor = both_sides_floor(adam_denominators(trl.grad_steps), adam_denominators(mine.grad_steps))
    tight = split_diffs(trl.params, mine.params, floor[-1])[0]
    assert tight > 9 * TOL
    with pytest.raises(AssertionError):
        assert_weights_close(trl.params, mine.params, floor[-1], LR, TOL, steps=1)


def test_std_epsilon_differs_by_design(model_dir: Path, batch: Batch, tmp_path: Path) -> None:
    """Our default 1e-6 (verl's) against TRL's 1e-4: advantages differ by A * (1e-4 - 1e-6) /
    (std + 1e-4), about 1e-4 relative."""
    trl = _trl(model_dir, batch, tmp_path, loss_type="bnpo")
    mine = _ours(model_dir, batch, norm_adv_eps=1e-6)
    rel = [abs(m - t) / abs(t) for m, t in zip(mine.advantages, trl.advantages) if abs(t) > 0.1]
    assert rel and all(5e-5 < r < 1e-3 for r in rel), rel


def test_dr_grpo_divides_by_a_constant_we_do_not(
    model_dir: Path, batch: Batch, tmp_path: Path
) -> None:
    """TRL's dr_grpo divides the token sum by batch * max_completion_length; our
    seq-mean-token-sum by the batch alone: the loss and the gradient are exactly
    max_completion_length times TRL's."""
    trl = _trl(model_dir, batch, tmp_path, loss_type="dr_grpo", scale_rewards="none")
    mine = _ours(model_dir, batch, loss_agg_mode="seq-mean-token-sum", norm_adv_by_std=False)
    assert mine.advantages == pytest.approx(trl.advantages, abs=TOL)
    assert mine.loss == pytest.approx(MAX_COMPLETION * trl.loss, rel=1e-5)
    assert mine.grad_norm == pytest.approx(MAX_COMPLETION * trl.grad_norm, rel=1e-5)


def test_weight_decay_differs_only_on_norms_by_design(
    model_dir: Path, batch: Batch, tmp_path: Path
) -> None:
    """transformers' Trainer exempts biases and norm weights from weight decay; we decay
    every parameter (torch's AdamW as configured). Everything else stays equal."""
    trl = _trl(model_dir, batch, tmp_path, loss_type="bnpo", weight_decay=0.1)
    mine = _ours(model_dir, batch, weight_decay=0.1)
    diffs = max_param_diff(trl, mine)
    norms = {k for k in diffs if "norm" in k}
    assert norms and all(diffs[k] > 1e-5 for k in norms), diffs
    assert all(diffs[k] <= TOL for k in diffs if k not in norms), diffs


def test_one_rloo_update_equals_rloo_trainers(
    model_dir: Path, batch: Batch, tmp_path: Path
) -> None:
    """TRL's RLOOTrainer takes one importance ratio per sequence, of the summed log-probs; we
    take one per token and sum the token losses (seq-mean-token-sum). On policy both ratios
    are 1 and both gradients are ``-mean_i A_i * grad sum_t log p_it``: the update is the same.
    The loss values differ by design: TRL's is ``-mean_i A_i``, ours ``-mean_i A_i * len_i``."""
    trl = _trl(model_dir, batch, tmp_path, trainer="rloo")
    mine = _ours(model_dir, batch, advantage_estimator="rloo", loss_agg_mode="seq-mean-token-sum")
    assert trl.grad_norm > CLIP
    assert_same_update(trl, mine, LR, loss=False)
    lengths = [len(c) for c in batch.completions]
    want = -sum(a * n for a, n in zip(trl.advantages, lengths)) / len(lengths)
    assert mine.loss == pytest.approx(want, abs=TOL)
    assert trl.loss == pytest.approx(-sum(trl.advantages) / len(lengths), abs=TOL)
