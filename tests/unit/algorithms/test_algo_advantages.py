"""GRPO and GAE advantages against hand-computed values."""

import math

import pytest
import torch

from hybridflow.algorithms import gae_advantages, grpo_outcome_advantages, last_token_scores
from hybridflow.algorithms.advantages import grpo_batch_std_advantages
from hybridflow.algorithms.masked import masked_whiten


def test_grpo_group_normalised() -> None:
    # Group 0: scores [1, 0, 0]: mean 1/3, unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3,
    #   std 0.57735 -> advantages 1.1547, -0.57735, -0.57735.
    # Group 5: a single sample 0.5 -> mean 0, std 1 (verl's convention) -> 0.5.
    # Group 2: [2, 2] -> std 0 -> advantage 0 (eps keeps it finite).
    scores = torch.tensor([1.0, 0.0, 0.0, 0.5, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 5, 2, 2])
    adv = grpo_outcome_advantages(scores, groups, eps=1e-6)
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.5, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_batch_std_centres_in_the_group_and_scales_by_the_batch() -> None:
    # Scores [1, 0 | 3, 2]: group means .5 and 2.5 -> centred [.5, -.5, .5, -.5]; the batch
    # mean is 1.5, unbiased var (.25 + 2.25 + 2.25 + .25) / 3 = 5/3.
    scores = torch.tensor([1.0, 0.0, 3.0, 2.0])
    adv = grpo_batch_std_advantages(scores, torch.tensor([0, 0, 1, 1]), eps=0.0)
    r = 0.5 / math.sqrt(5 / 3)
    torch.testing.assert_close(adv, torch.tensor([r, -r, r, -r]))


def test_grpo_without_std_is_centred_score() -> None:
    scores = torch.tensor([1.0, 0.0, 0.0, 0.5, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 5, 2, 2])
    adv = grpo_outcome_advantages(scores, groups, norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.5, 0.0, 0.0]))


def test_grpo_group_ids_need_not_be_contiguous() -> None:
    scores = torch.tensor([1.0, 3.0, 0.0, 2.0])
    groups = torch.tensor([7, 9, 7, 9])
    # group 7: [1, 0], mean .5, std .7071 ; group 9: [3, 2], mean 2.5, std .7071
    adv = grpo_outcome_advantages(scores, groups, eps=0.0)
    r = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(adv, torch.tensor([r, r, -r, -r]))


def test_grpo_rejects_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        grpo_outcome_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))


def test_last_token_scores_places_score_at_last_valid_token() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = last_token_scores(torch.tensor([1.0, 2.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]))


def test_gae_undiscounted_is_return_minus_value() -> None:
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t = 1 - V_t; returns are all 1.
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]]))


def test_gae_discounted_with_padding() -> None:
    # gamma .9, lam .5 (gamma*lam = .45).
    # Row 0: t2: delta = 1 - .7 = .3 -> A2 .3; t1: delta = .9*.7 - .6 = .03 -> A1 = .03 + .45*.3
    #   = .165; t0: delta = .9*.6 - .5 = .04 -> A0 = .04 + .45*.165 = .11425.
    # Row 1 (length 2, padded value 9.9 ignored): t1: delta = 1 - .6 = .4; t0: delta = .04 ->
    #   A0 = .04 + .45*.4 = .22. Returns = A + V on valid tokens, 0 on padding.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.9]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.11425, 0.165, 0.3], [0.22, 0.4, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.61425, 0.765, 1.0], [0.72, 1.0, 0.0]]))


def test_gae_whitened_has_zero_mean_unit_variance_on_valid_tokens() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.9]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, _ = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5, whiten=True)
    valid = adv[mask.bool()]
    assert abs(valid.mean().item()) < 1e-6
    assert abs(valid.std().item() - 1.0) < 1e-5
    assert adv[1, 2].item() == 0.0


def test_masked_whiten_with_given_statistics() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # local stats: mean 2, unbiased var 1 -> [-1, 0, 1, 0]
    torch.testing.assert_close(masked_whiten(x, mask), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))
    # given stats: mean 0, var 4 -> x / 2 on valid tokens
    given = masked_whiten(x, mask, mean=torch.tensor(0.0), var=torch.tensor(4.0))
    torch.testing.assert_close(given, torch.tensor([[0.5, 1.0, 1.5, 0.0]]))


def test_returns_carry_over_holes_in_the_mask_like_absent_tokens() -> None:
    """Multi-turn: observation tokens are holes; the policy tokens before them see the later
    turns' rewards exactly as the same sequence without the holes would."""
    from hybridflow.algorithms.advantages import gae_advantages, reinforce_plus_plus_advantages

    holes = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 2.0, 0.0, 0.0]])
    _, with_holes = reinforce_plus_plus_advantages(rewards, holes, gamma=0.5)
    assert with_holes[0].tolist() == [0.25, 0.5, 0.0, 0.0, 1.0]
    assert with_holes[1].tolist() == [0.5, 1.0, 2.0, 0.0, 0.0]
    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3], [0.1, 0.2, 0.3, 9.0, 9.0]])
    adv, _ = gae_advantages(rewards, values, holes, gamma=0.9, lam=0.8, whiten=False)
    compact, _ = gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.1, 0.2, 0.3]]),
        torch.ones(1, 3), gamma=0.9, lam=0.8, whiten=False,
    )  # fmt: skip
    torch.testing.assert_close(adv[0, [0, 1, 4]], compact[0])
