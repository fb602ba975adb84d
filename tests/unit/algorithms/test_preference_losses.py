"""DPO, KTO, ORPO and SFT losses against their published formulas on examples worked by hand.

DPO: Rafailov et al. 2023, eq. 7 (TRL ``loss_type="sigmoid"``, label smoothing as in
conservative DPO); its hinge (SLiC-HF, Zhao et al. 2023) and IPO (Azar et al. 2023, eq. 17)
variants. KTO: Ethayarajh et al. 2024, eq. 8 (TRL's ``kto_loss``: z0 = max(0, KL)). ORPO:
Hong et al. 2024, eqs. 6-7 on token-mean log-probs (TRL's ``odds_ratio_loss``).
The expected numbers are written out below with the arithmetic that produced them.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms.preference import (
    dpo_loss,
    kto_loss,
    kto_reference_point,
    log1mexp,
    orpo_loss,
    sequence_logprobs,
    sft_nll_sum,
)

TOL = 1e-6


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_dpo_worked_example() -> None:
    # Pair 0: pi_c=-1, pi_r=-3, ref_c=-2, ref_r=-2.5, beta=0.5.
    #   h = (-1 + 3) - (-2 + 2.5) = 1.5; beta*h = 0.75
    #   loss = -log sigma(0.75) = log(1 + e^-0.75) = log(1.4723665527) = 0.3868706
    #   rewards: chosen 0.5*(-1 + 2) = 0.5, rejected 0.5*(-3 + 2.5) = -0.25
    # Pair 1: the policy prefers the rejected one: pi_c=-2, pi_r=-1, refs equal (-1.5 both).
    #   h = -1; beta*h = -0.5; loss = log(1 + e^0.5) = log(2.6487212707) = 0.9740770
    out = dpo_loss(_t(-1.0, -2.0), _t(-3.0, -1.0), _t(-2.0, -1.5), _t(-2.5, -1.5), beta=0.5)
    assert out.losses.tolist() == pytest.approx([0.3868706, 0.9740770], abs=TOL)
    assert out.chosen_rewards.tolist() == pytest.approx([0.5, -0.25], abs=TOL)
    assert out.rejected_rewards.tolist() == pytest.approx([-0.25, 0.25], abs=TOL)


def test_dpo_label_smoothing_worked_example() -> None:
    # eps = 0.1, beta*h = 0.75: 0.9 * log(1 + e^-0.75) + 0.1 * log(1 + e^0.75)
    #   = 0.9 * 0.3868706 + 0.1 * (0.75 + 0.3868706) = 0.3481835 + 0.1136871 = 0.4618706
    out = dpo_loss(_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.5), beta=0.5, label_smoothing=0.1)
    assert out.losses.item() == pytest.approx(0.4618706, abs=TOL)


def test_dpo_gradient_raises_chosen_and_lowers_rejected() -> None:
    chosen, rejected = _t(-2.0).requires_grad_(), _t(-2.0).requires_grad_()
    dpo_loss(chosen, rejected, _t(-2.0), _t(-2.0), beta=0.1).losses.sum().backward()
    # d/dh of -log sigma(beta h) at h=0 is -beta/2.
    assert chosen.grad is not None and rejected.grad is not None
    assert chosen.grad.item() == pytest.approx(-0.05, abs=TOL)
    assert rejected.grad.item() == pytest.approx(0.05, abs=TOL)


def test_hinge_and_ipo_worked_examples() -> None:
    # The pair of the DPO example: h = 1.5.
    #   hinge, beta 0.5: max(0, 1 - 0.75) = 0.25; beta 1: max(0, 1 - 1.5) = 0 (margin met)
    #   ipo, beta 0.5: (1.5 - 1/(2*0.5))^2 = 0.5^2 = 0.25; beta 0.1: (1.5 - 5)^2 = 12.25
    args = (_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.5))
    assert dpo_loss(*args, beta=0.5, loss_type="hinge").losses.item() == pytest.approx(0.25)
    assert dpo_loss(*args, beta=1.0, loss_type="hinge").losses.item() == 0.0
    assert dpo_loss(*args, beta=0.5, loss_type="ipo").losses.item() == pytest.approx(0.25)
    assert dpo_loss(*args, beta=0.1, loss_type="ipo").losses.item() == pytest.approx(12.25)
    out = dpo_loss(*args, beta=0.5, loss_type="ipo")  # same implicit rewards as sigmoid
    assert (out.chosen_rewards.item(), out.rejected_rewards.item()) == pytest.approx((0.5, -0.25))


def test_ipo_pulls_the_margin_to_its_target_from_both_sides() -> None:
    # Target 1/(2 beta) = 1 at beta 0.5. d loss / d pi_c = 2 (h - 1): above the target the
    # chosen log-prob is pushed down (sigmoid DPO would push it up without bound).
    for h, grad in ((3.0, 4.0), (0.0, -2.0)):
        chosen = _t(h).requires_grad_()
        dpo_loss(chosen, _t(0.0), _t(0.0), _t(0.0), beta=0.5, loss_type="ipo").losses.backward()
        assert chosen.grad is not None and chosen.grad.item() == pytest.approx(grad)


def test_variant_refusals() -> None:
    args = (_t(-1.0), _t(-3.0), _t(-2.0), _t(-2.5))
    with pytest.raises(ValueError, match="loss_type must be one of"):
        dpo_loss(*args, beta=0.5, loss_type="orpo")
    with pytest.raises(ValueError, match="label_smoothing applies to the sigmoid loss, not ipo"):
        dpo_loss(*args, beta=0.5, label_smoothing=0.1, loss_type="ipo")


def test_kto_worked_example() -> None:
    # Mismatched pairs: pi - ref = (-4 + 4.5, -3 + 3.3) = (0.5, 0.3); z0 = max(0, 0.4) = 0.4.
    z0 = kto_reference_point(_t(-4.0, -3.0), _t(-4.5, -3.3))
    assert z0.item() == pytest.approx(0.4, abs=TOL)
    # Example 0, desirable: r = -1 + 1.5 = 0.5; 1 - sigma(1.0 * (0.5 - 0.4)) = 1 - sigma(0.1)
    #   = 1 - 0.5249792 = 0.4750208 (desirable_weight 1).
    # Example 1, undesirable: r = -2 + 1 = -1; 1 - sigma(1.0 * (0.4 + 1)) = 1 - sigma(1.4)
    #   = 1 - 0.8021839 = 0.1978161, times undesirable_weight 2 = 0.3956322.
    out = kto_loss(
        _t(-1.0, -2.0),
        _t(-1.5, -1.0),
        torch.tensor([True, False]),
        z0,
        beta=1.0,
        desirable_weight=1.0,
        undesirable_weight=2.0,
    )
    assert out.losses.tolist() == pytest.approx([0.4750208, 0.3956322], abs=TOL)
    assert out.rewards.tolist() == pytest.approx([0.5, -1.0], abs=TOL)


def test_kto_reference_point_is_clamped_at_zero_and_detached() -> None:
    policy = _t(-5.0, -5.0).requires_grad_()
    z0 = kto_reference_point(policy, _t(-4.0, -4.5))  # mean(pi - ref) = -0.75 -> 0
    assert z0.item() == 0.0
    assert not z0.requires_grad
    # With z0 = 0 and beta = 0.5, a desirable r = 2: 1 - sigma(1) = 1 - 0.7310586 = 0.2689414.
    out = kto_loss(_t(0.0), _t(-2.0), torch.tensor([True]), z0, beta=0.5)
    assert out.losses.item() == pytest.approx(0.2689414, abs=TOL)


def test_orpo_worked_example() -> None:
    # Token-mean probabilities P(y|x): pair 0 chosen 0.5, rejected 0.2; pair 1 swapped.
    # odds(0.5) = 0.5/0.5 = 1, odds(0.2) = 0.2/0.8 = 0.25, so log OR = log(1/0.25) = log 4
    # for pair 0 and -log 4 for pair 1. -log sigma(log 4) = -log(4/5) = log 1.25 = 0.2231436;
    # -log sigma(-log 4) = -log(1/5) = log 5 = 1.6094379.
    half, fifth = torch.log(_t(0.5)).item(), torch.log(_t(0.2)).item()
    out = orpo_loss(_t(half, fifth), _t(fifth, half))
    assert out.log_odds_ratio.tolist() == pytest.approx([1.3862944, -1.3862944], abs=TOL)
    assert out.losses.tolist() == pytest.approx([0.2231436, 1.6094379], abs=TOL)


def test_orpo_gradient_raises_chosen_and_lowers_rejected() -> None:
    chosen = _t(-1.0, -0.3).requires_grad_()
    rejected = _t(-0.8, -2.0).requires_grad_()
    orpo_loss(chosen, rejected).losses.sum().backward()
    assert chosen.grad is not None and rejected.grad is not None
    assert bool((chosen.grad < 0).all()) and bool((rejected.grad > 0).all())


def test_log1mexp_is_accurate_on_both_branches() -> None:
    # log(1 - e^x): x = -1e-6 gives log(1e-6 - 5e-13) = -13.8155111 (expm1 branch; the naive
    # log1p(-exp(x)) loses digits there); x = -20 gives log1p(-2.06e-9) = -2.0611536e-9.
    x = _t(-1e-6, -0.5, -20.0)
    expected = [-13.8155111, float(torch.log1p(-torch.exp(_t(-0.5)))), -2.0611536e-9]
    assert log1mexp(x).tolist() == pytest.approx(expected, rel=1e-7)


def test_sft_nll_and_sequence_logprobs_skip_padding() -> None:
    logp = _t(-0.5, -1.0, -9.0, -2.0, -9.0, -9.0).reshape(2, 3)
    mask = _t(1, 1, 0, 1, 0, 0).reshape(2, 3)
    # Token-mean NLL: (0.5 + 1.0 + 2.0) / 3 tokens = 1.1666667.
    assert (sft_nll_sum(logp, mask) / 3).item() == pytest.approx(3.5 / 3, abs=TOL)
    assert sequence_logprobs(logp, mask).tolist() == pytest.approx([-1.5, -2.0], abs=TOL)
    # IPO's token means: -1.5 / 2 tokens, -2.0 / 1 token; an empty row gives 0, not NaN.
    assert sequence_logprobs(logp, mask, mean=True).tolist() == pytest.approx([-0.75, -2.0])
    assert sequence_logprobs(logp[:1], mask[:1] * 0, mean=True).tolist() == [0.0]


@pytest.mark.parametrize("beta", [0.0, -1.0])
def test_bad_beta_is_refused(beta: float) -> None:
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(_t(0.0), _t(0.0), _t(0.0), _t(0.0), beta=beta)
    with pytest.raises(ValueError, match="beta"):
        kto_loss(_t(0.0), _t(0.0), torch.tensor([True]), 0.0, beta=beta)
