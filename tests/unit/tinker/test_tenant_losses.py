"""Tinker's built-in losses on hand-made log-probs: each loss's value and gradient as its
formula says (cispo's clipped ratio a coefficient without gradient, dro's quadratic penalty),
the defaults of each ``loss_fn_config``, and configs a loss cannot use refused by name."""

from __future__ import annotations

import pytest
import torch

from hybridflow.services.learner.tenant_losses import (
    LOSSES,
    LossConfigError,
    loss,
    resolve_config,
)

SAMPLED = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
ADVANTAGES = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position is padding
SHIFT = torch.tensor([[0.1, -3.0, 2.0, 5.0]])
"""target_lp - sampled: ratios 1.105, 0.0498 and 7.39 (above cispo's 4.0), then padding."""


def _value_and_grad(loss_fn: str, config: dict[str, float]) -> tuple[float, torch.Tensor]:
    target_lp = (SAMPLED + SHIFT).clone().requires_grad_(True)
    batch = {"logprobs": SAMPLED, "advantages": ADVANTAGES, "mask": MASK}
    value = loss(loss_fn, target_lp, batch, resolve_config(loss_fn, config))
    value.backward()
    assert target_lp.grad is not None
    return float(value), target_lp.grad


def test_every_loss_is_served() -> None:
    assert LOSSES == ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")


def test_cispo_weights_the_log_prob_by_the_clipped_ratio_without_its_gradient() -> None:
    value, grad = _value_and_grad("cispo", {})
    ratio = torch.exp(SHIFT).clamp(0.0, 4.0)  # the defaults: no lower clip, 4.0 above
    target_lp = SAMPLED + SHIFT
    assert value == pytest.approx(float(-(ratio * target_lp * ADVANTAGES * MASK).sum()), rel=1e-6)
    # d/d target_lp of -(c * target_lp * A) with c held: -c * A, zero on padding
    torch.testing.assert_close(grad, -(ratio * ADVANTAGES * MASK))
    assert float(grad[0, 2]) == pytest.approx(-4.0 * 0.5)  # clipped at 4.0, not 7.39


def test_cispo_takes_its_thresholds_from_the_call() -> None:
    _, grad = _value_and_grad("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.0})
    torch.testing.assert_close(grad, -(torch.tensor([[1.0, 0.5, 1.0, 1.0]]) * ADVANTAGES * MASK))


def test_dro_is_the_advantage_term_less_half_beta_times_the_squared_log_ratio() -> None:
    value, grad = _value_and_grad("dro", {"beta": 0.1})
    target_lp = SAMPLED + SHIFT
    objective = target_lp * ADVANTAGES - 0.05 * SHIFT**2
    assert value == pytest.approx(float(-(objective * MASK).sum()), rel=1e-6)
    torch.testing.assert_close(grad, -(ADVANTAGES - 0.1 * SHIFT) * MASK)


def test_ppo_defaults_are_point_eight_and_one_point_two() -> None:
    assert resolve_config("ppo", {}) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert resolve_config("cispo", {"clip_high_threshold": 2}) == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 2.0,
    }


@pytest.mark.parametrize(
    ("loss_fn", "config", "says"),
    [
        ("dro", {}, "dro needs loss_fn_config['beta']"),
        ("cross_entropy", {"beta": 1.0}, "not read by cross_entropy (it reads no keys)"),
        ("ppo", {"clip_ratio": 0.2}, "['clip_ratio'] is not read by ppo"),
        ("cispo", {"clip_low_threshold": 2.0, "clip_high_threshold": 1.0}, "is above"),
    ],
)
def test_a_config_the_loss_cannot_use_is_refused_by_name(
    loss_fn: str, config: dict[str, float], says: str
) -> None:
    with pytest.raises(LossConfigError, match=None) as refused:
        resolve_config(loss_fn, config)
    assert says in str(refused.value)
