"""Sampler math against hand-computed values."""

import math

import pytest
import torch

from hybridflow.services.rollout.sampler import (
    sample_tokens,
    scale_logits,
    top_k_filter,
    top_p_filter,
)

# probabilities 0.5, 0.3, 0.15, 0.05, placed out of order to exercise the sort
PROBS = [0.15, 0.5, 0.05, 0.3]
LOGITS = torch.log(torch.tensor([PROBS]))


def test_scale_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert scale_logits(logits, 2.0).tolist() == [[0.5, 1.0, 1.5]]
    assert scale_logits(logits, 1.0).tolist() == [[1.0, 2.0, 3.0]]
    assert scale_logits(logits, 0.0).tolist() == [[1.0, 2.0, 3.0]]  # greedy reports T=1
    with pytest.raises(ValueError, match="temperature"):
        scale_logits(logits, -0.5)


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (1.0, {0, 1, 2, 3}),
        (0.5, {1}),  # 0.5 alone reaches 0.5
        (0.49, {1}),
        (0.7, {1, 3}),  # 0.5 + 0.3 = 0.8 >= 0.7
        (0.8, {1, 3}),
        (0.81, {0, 1, 3}),  # + 0.15 = 0.95
        (0.96, {0, 1, 2, 3}),
        (1e-6, {1}),  # the top token is always kept
    ],
)
def test_top_p_keeps_smallest_nucleus(top_p: float, kept: set[int]) -> None:
    # 0.5 + 0.3 is exactly 0.8 in real numbers; nudge the logits so float rounding of the
    # cumulative sum cannot decide the 0.8 case.
    logits = LOGITS.clone()
    logits[0, 1] += 1e-4
    filtered = top_p_filter(logits, top_p)
    got = {i for i in range(4) if math.isfinite(filtered[0, i].item())}
    assert got == kept
    for i in kept:
        assert filtered[0, i].item() == logits[0, i].item()


def test_top_p_is_per_row() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.4], [0.4, 0.6]]))
    filtered = top_p_filter(logits, 0.55)
    assert torch.isfinite(filtered).tolist() == [[True, False], [False, True]]
    with pytest.raises(ValueError, match="top_p"):
        top_p_filter(logits, 0.0)


@pytest.mark.parametrize(
    ("top_k", "kept"),
    [
        (0, {0, 1, 2, 3}),
        (1, {1}),
        (2, {1, 3}),
        (3, {0, 1, 3}),
        (4, {0, 1, 2, 3}),
        (9, {0, 1, 2, 3}),
    ],
)
def test_top_k_keeps_the_k_most_likely(top_k: int, kept: set[int]) -> None:
    filtered = top_k_filter(LOGITS, top_k)
    assert {i for i in range(4) if math.isfinite(filtered[0, i].item())} == kept
    for i in kept:
        assert filtered[0, i].item() == LOGITS[0, i].item()


def test_top_k_is_per_row_and_refuses_a_negative_k() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [
        [True, True, False],
        [False, True, True],
    ]
    with pytest.raises(ValueError, match="top_k"):
        top_k_filter(logits, -1)


def test_top_p_applies_to_the_top_k_renormalised() -> None:
    # top-k 2 keeps 0.5 and 0.3, renormalised 0.625 and 0.375: top_p 0.6 keeps token 1 alone
    # (0.625 >= 0.6), although over all four tokens it would keep two (0.5 < 0.6).
    gen = torch.Generator().manual_seed(0)
    tokens, _ = sample_tokens(LOGITS.repeat(200, 1), 1.0, 0.6, gen, top_k=2)
    assert set(tokens.tolist()) == {1}
    tokens, _ = sample_tokens(LOGITS.repeat(200, 1), 1.0, 0.6, gen)
    assert set(tokens.tolist()) == {1, 3}


def test_greedy_picks_argmax_with_temperature_one_logprob() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [2.0, 1.0]])
    tokens, logprobs = sample_tokens(logits, temperature=0.0, top_p=1.0, generator=None)
    assert tokens.tolist() == [1, 0]
    assert logprobs[0].item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert logprobs[1].item() == pytest.approx(2.0 - math.log(math.exp(2) + math.exp(1)), abs=1e-6)


def test_reported_logprob_is_tempered_and_before_top_p() -> None:
    # At T=2 the tempered probabilities are sqrt(p) normalised: token 1 has 0.379, so top_p 0.3
    # (applied after temperature) forces it; its reported log-prob is the untruncated one.
    temperature = 2.0
    logits = LOGITS.repeat(3, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits, temperature, top_p=0.3, generator=gen)
    assert tokens.tolist() == [1, 1, 1]
    tempered = [p**0.5 for p in PROBS]
    expected = math.log(tempered[1] / sum(tempered))
    assert logprobs.tolist() == pytest.approx([expected] * 3, abs=1e-6)


def test_reported_logprob_is_before_top_k() -> None:
    # top-k 1 forces token 1 (0.5); its reported log-prob is log 0.5 at T=1, not log 1.
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(LOGITS.repeat(3, 1), 1.0, 1.0, gen, top_k=1)
    assert tokens.tolist() == [1, 1, 1]
    assert logprobs.tolist() == pytest.approx([math.log(0.5)] * 3, abs=1e-6)
    tokens, logprobs = sample_tokens(LOGITS.repeat(400, 1), 1.0, 1.0, gen, top_k=2)
    assert set(tokens.tolist()) == {1, 3}
    assert logprobs[tokens == 3].tolist() == pytest.approx(
        [math.log(0.3)] * int((tokens == 3).sum()), abs=1e-6
    )


def test_sampling_frequencies_follow_tempered_distribution() -> None:
    temperature = 0.5
    logits = LOGITS.repeat(20000, 1)
    gen = torch.Generator().manual_seed(1)
    tokens, logprobs = sample_tokens(logits, temperature, top_p=1.0, generator=gen)
    tempered = [p**2 for p in PROBS]
    z = sum(tempered)
    counts = torch.bincount(tokens, minlength=4).double() / len(tokens)
    for i in range(4):
        assert counts[i].item() == pytest.approx(tempered[i] / z, abs=0.015)
        chosen = logprobs[tokens == i]
        if len(chosen):
            assert chosen[0].item() == pytest.approx(math.log(tempered[i] / z), abs=1e-5)


def test_same_generator_seed_same_tokens() -> None:
    logits = torch.randn(64, 10, generator=torch.Generator().manual_seed(5))
    a = sample_tokens(logits, 1.0, 0.9, torch.Generator().manual_seed(7))
    b = sample_tokens(logits, 1.0, 0.9, torch.Generator().manual_seed(7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_rejects_non_matrix_logits() -> None:
    with pytest.raises(ValueError, match="logits"):
        sample_tokens(torch.zeros(5), 1.0, 1.0, None)
