import math

import pytest
import torch

from hybridflow.algorithms.off_policy import importance_weights
from hybridflow.algorithms.policy_loss import compute_policy_loss


def test_none_gives_no_weights():
    assert importance_weights(torch.zeros(1, 2), torch.zeros(1, 2), "none", 2.0) is None


def test_tis_truncates_ratio_of_proximal_to_behaviour():
    prox = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.1)]])
    behav = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.4)]])
    w = importance_weights(prox, behav, "tis", cap=1.5)
    # ratios 2.0 (-> cap 1.5), 1.0, 0.25
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 0.25]]))
    w = importance_weights(prox, behav, "decoupled", cap=10.0)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.25]]))


def test_bad_mode_or_cap():
    with pytest.raises(ValueError, match="off-policy mode"):
        importance_weights(torch.zeros(1), torch.zeros(1), "is", 2.0)
    with pytest.raises(ValueError, match="cap"):
        importance_weights(torch.zeros(1), torch.zeros(1), "tis", 0.0)


def test_weights_scale_the_token_losses():
    logp = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    plain = compute_policy_loss(logp, logp, adv, mask)
    # ratio 1 everywhere: per-token loss -1; weights 0.5 and 1.5 -> token-mean -1.0 still,
    # weights 0.5, 0.5 -> -0.5.
    half = compute_policy_loss(logp, logp, adv, mask, token_weights=torch.full((1, 2), 0.5))
    assert plain.loss.item() == pytest.approx(-1.0)
    assert half.loss.item() == pytest.approx(-0.5)
