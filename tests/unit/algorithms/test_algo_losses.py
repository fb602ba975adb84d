"""Policy loss, value loss and loss aggregation against hand-computed values."""

import math

import pytest
import torch

from hybridflow.algorithms import agg_loss, compute_policy_loss, compute_value_loss

# One sequence of 4 tokens, old log-probs 0, ratios [1, 1.5, 0.5, 5], advantages [1, 1, -1, -2],
# clip low .2 / high .3, dual-clip c = 3:
#   t0: ratio 1,   A  1: l1 = -1,   l2 = -1            -> -1   (no clip)
#   t1: ratio 1.5, A  1: l1 = -1.5, l2 = -1.3          -> -1.3 (clipped)
#   t2: ratio .5,  A -1: l1 = .5,   l2 = .8            -> .8   (clipped); dual min(3, .8) = .8
#   t3: ratio 5,   A -2: l1 = 10,   l2 = 2.6           -> 10;  dual min(6, 10) = 6 (lower clip)
# token-mean loss = (-1 - 1.3 + .8 + 6) / 4 = 1.125; clipfrac 2/4; clipfrac_lower 1/4;
# ppo_kl = mean(old - new) = -(ln 1.5 + ln .5 + ln 5) / 4 = -ln(3.75) / 4.
RATIOS = [1.0, 1.5, 0.5, 5.0]
ADV = [1.0, 1.0, -1.0, -2.0]


def _policy_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = torch.tensor([[math.log(r) for r in RATIOS]], requires_grad=True)
    return torch.zeros(1, 4), logp, torch.tensor([ADV]), torch.ones(1, 4)


def test_policy_loss_asymmetric_and_dual_clip() -> None:
    old, logp, adv, mask = _policy_inputs()
    out = compute_policy_loss(old, logp, adv, mask, 0.2, 0.3, 3.0, "token-mean")
    assert out.loss.item() == pytest.approx(1.125, abs=1e-6)
    assert out.pg_clipfrac.item() == pytest.approx(0.5)
    assert out.pg_clipfrac_lower.item() == pytest.approx(0.25)
    assert out.ppo_kl.item() == pytest.approx(-math.log(3.75) / 4, abs=1e-6)
    out.loss.backward()
    # Only t0 is unclipped: d/dlogp (-A * exp(logp)) / 4 = -1 * 1 / 4; clipped tokens get 0.
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 0.0, 0.0, 0.0]]))


def test_policy_loss_without_dual_clip() -> None:
    old, logp, adv, mask = _policy_inputs()
    out = compute_policy_loss(old, logp, adv, mask, 0.2, 0.3, None, "token-mean")
    # t3 keeps its unbounded loss 10: (-1 - 1.3 + .8 + 10) / 4 = 2.125
    assert out.loss.item() == pytest.approx(2.125, abs=1e-6)
    assert out.pg_clipfrac_lower.item() == 0.0


def test_policy_loss_on_policy_is_minus_mean_advantage() -> None:
    # ratio 1 everywhere: loss = mean(-A) = -(1 + 1 - 1 - 2) / 4 = .25, nothing clipped.
    adv = torch.tensor([ADV])
    out = compute_policy_loss(torch.zeros(1, 4), torch.zeros(1, 4), adv, torch.ones(1, 4))
    assert out.loss.item() == pytest.approx(0.25)
    assert out.pg_clipfrac.item() == 0.0
    assert out.ppo_kl.item() == 0.0


def test_policy_loss_rejects_bad_dual_clip() -> None:
    old, logp, adv, mask = _policy_inputs()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(old, logp, adv, mask, clip_ratio_c=1.0)


LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 21 / 6),  # (1+2+3+4+5+6) / 6 tokens
        ("seq-mean-token-sum", (10 + 11) / 2),  # token sums 10 and 11, mean over 2 seqs
        ("seq-mean-token-mean", (2.5 + 5.5) / 2),  # token means 2.5 and 5.5
    ],
)
def test_agg_loss_modes(mode: str, expected: float) -> None:
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_agg_loss_with_global_normalisers_is_additive(mode: str) -> None:
    full = agg_loss(LOSS, MASK, mode)
    parts = sum(
        agg_loss(LOSS[i : i + 1], MASK[i : i + 1], mode, num_tokens=6.0, num_seqs=2.0)
        for i in range(2)
    )
    assert float(parts) == pytest.approx(full.item())


def test_agg_loss_ignores_all_padding_rows() -> None:
    loss = torch.cat([LOSS, torch.full((1, 4), 99.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=MASK.dtype)])
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(4.0)


def test_agg_loss_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(LOSS, MASK, "sum")


def test_value_loss_clipped() -> None:
    # t0: v 1, old 0, R 0: l1 = 1; clip(1, -.5, .5) = .5 -> l2 = .25; max 1 (not clipped)
    # t1: v 2.6, old 1.9, R 3: l1 = .16; clip -> 2.4 -> l2 = .36; max .36 (clipped)
    # loss = .5 * (1 + .36) / 2 = .34 ; clipfrac 1/2
    vpreds = torch.tensor([[1.0, 2.6]])
    old = torch.tensor([[0.0, 1.9]])
    returns = torch.tensor([[0.0, 3.0]])
    out = compute_value_loss(vpreds, old, returns, torch.ones(1, 2), value_clip=0.5)
    assert out.loss.item() == pytest.approx(0.34, abs=1e-6)
    assert out.vf_clipfrac.item() == pytest.approx(0.5)
    unclipped = compute_value_loss(vpreds, old, returns, torch.ones(1, 2), value_clip=None)
    assert unclipped.loss.item() == pytest.approx(0.5 * (1 + 0.16) / 2, abs=1e-6)
