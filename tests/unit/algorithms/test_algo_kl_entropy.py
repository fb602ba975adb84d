"""KL estimators, KL reward penalty, entropy and log-probs against hand-computed values."""

import math

import pytest
import torch

from hybridflow.algorithms import (
    apply_kl_penalty,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
)

LN2 = math.log(2.0)
# Token 0: pi .5, ref .25 -> log ratio +ln2 ; token 1: pi .25, ref .5 -> log ratio -ln2.
LOGP = torch.tensor([math.log(0.5), math.log(0.25)])
REF = torch.tensor([math.log(0.25), math.log(0.5)])


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        ("k1", [LN2, -LN2]),
        ("kl", [LN2, -LN2]),
        ("abs", [LN2, LN2]),
        ("k2", [0.5 * LN2**2, 0.5 * LN2**2]),
        ("mse", [0.5 * LN2**2, 0.5 * LN2**2]),
        # k3 = exp(ref - logp) - (ref - logp) - 1: .5 + ln2 - 1 and 2 - ln2 - 1
        ("k3", [0.5 + LN2 - 1, 2 - LN2 - 1]),
        ("low_var_kl", [0.5 + LN2 - 1, 2 - LN2 - 1]),
    ],
)
def test_kl_estimators(estimator: str, expected: list[float]) -> None:
    torch.testing.assert_close(kl_penalty(LOGP, REF, estimator), torch.tensor(expected))


def test_kl_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(LOGP, REF, "k9")


def test_kl_reward_penalty() -> None:
    # scores [0, 1] at the two tokens, k1 = [ln2, -ln2], coef .1 -> [-.1 ln2, 1 + .1 ln2];
    # a padded third token gets no penalty.
    scores = torch.tensor([[0.0, 1.0, 0.0]])
    logp = torch.tensor([[*LOGP.tolist(), 5.0]])
    ref = torch.tensor([[*REF.tolist(), 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    rewards, kl = apply_kl_penalty(scores, logp, ref, mask, kl_coef=0.1, estimator="k1")
    torch.testing.assert_close(rewards, torch.tensor([[-0.1 * LN2, 1 + 0.1 * LN2, 0.0]]))
    torch.testing.assert_close(kl, torch.tensor([[LN2, -LN2, 0.0]]))


def test_entropy_from_logits() -> None:
    # uniform over 4: ln 4 ; probs [.5, .25, .25]: .5 ln2 + 2 * .25 ln4 = 1.5 ln2 ; shift-invariant
    logits = torch.tensor(
        [[0.0, 0.0, 0.0, 0.0], [math.log(0.5) + 7, math.log(0.25) + 7, math.log(0.25) + 7, -1e9]]
    )
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([math.log(4), 1.5 * LN2]))


def test_logprobs_with_temperature() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probs .25, .75
    label = torch.tensor([1])
    assert logprobs_from_logits(logits, label, 1.0).item() == pytest.approx(math.log(0.75))
    # T = 0 (greedy) is reported at T = 1
    assert logprobs_from_logits(logits, label, 0.0).item() == pytest.approx(math.log(0.75))
    # T = 2: probs proportional to [1, sqrt 3] -> sqrt3 / (1 + sqrt3)
    s3 = math.sqrt(3.0)
    assert logprobs_from_logits(logits, label, 2.0).item() == pytest.approx(math.log(s3 / (1 + s3)))
