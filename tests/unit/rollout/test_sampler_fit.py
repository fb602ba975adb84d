"""The HF engine's sampler draws from the intended distribution: a chi-square goodness-of-fit
test over 20,000 seeded draws per setting, against a distribution computed here independently
(float64 numpy, not the sampler's code), and the same test rejecting near-miss distributions
(temperature off by 20 %, a nucleus one token too large or too small).

The intended distribution (our contract, ``hybridflow/services/rollout/sampler.py``): softmax of
``logits / T``; with ``top_p < 1`` the nucleus is the smallest set of most likely tokens whose
mass reaches ``top_p`` (a token is kept iff the mass strictly before it, in descending order,
is below ``top_p``: HF's ``TopPLogitsWarper`` and vLLM keep the same set), renormalised. There
is no top-k (``SamplingParams`` has none). Settings keep every cumulative mass at least 1e-3
away from ``top_p``, so float rounding cannot move the boundary.

Seeds are fixed, so each statistic is one number (listed in docs/trl-parity.md) and the
thresholds are deterministic: the intended distribution must give p > 1e-3, a near miss
p < 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.services.rollout.sampler import sample_tokens
from tests.goodness_of_fit import (
    P_ACCEPT,
    P_REJECT,
    counts_of,
    goodness_of_fit,
    intended,
    nucleus_size,
    tempered,
)

NUM_DRAWS = 20_000
PROBS = [0.08, 0.30, 0.02, 0.16, 0.06, 0.22, 0.04, 0.12]  # shuffled to exercise the sort
LOGITS = np.log(np.asarray(PROBS))
SETTINGS = [(1.0, 1.0), (0.7, 1.0), (1.6, 1.0), (1.0, 0.75), (1.3, 0.8), (0.5, 0.9)]
"""(temperature, top_p); setting i draws with seed i (one shared seed would correlate them)."""


def draw(temperature: float, top_p: float, seed: int) -> torch.Tensor:
    logits = torch.from_numpy(LOGITS).float().repeat(NUM_DRAWS, 1)
    gen = torch.Generator().manual_seed(seed)
    tokens, _ = sample_tokens(logits, temperature, top_p, gen)
    return counts_of(tokens, len(PROBS))


@pytest.mark.parametrize(("temperature", "top_p"), SETTINGS)
def test_draws_fit_the_intended_distribution(temperature: float, top_p: float) -> None:
    counts = draw(temperature, top_p, seed=SETTINGS.index((temperature, top_p)))
    fit = goodness_of_fit(counts, intended(LOGITS, temperature, top_p))
    assert fit.p_value > P_ACCEPT, fit


@pytest.mark.parametrize(("temperature", "top_p"), SETTINGS)
def test_the_same_draws_reject_a_near_miss(temperature: float, top_p: float) -> None:
    """The test has power: a 20 % temperature error, or a nucleus off by one, is rejected."""
    counts = draw(temperature, top_p, seed=SETTINGS.index((temperature, top_p)))
    wrong = [intended(LOGITS, 1.2 * temperature, top_p)]
    if top_p < 1.0:
        size = nucleus_size(tempered(LOGITS, temperature), top_p)
        wrong += [intended(LOGITS, temperature, top_p, keep=k) for k in (size - 1, size + 1) if k]
    for probs in wrong:
        fit = goodness_of_fit(counts, probs)
        assert fit.p_value < P_REJECT, fit


def test_tokens_outside_the_nucleus_are_never_drawn() -> None:
    counts = draw(1.0, 0.75, seed=3)  # nucleus: 0.30, 0.22, 0.16, 0.12 (mass before 0.68)
    assert {i for i, c in enumerate(counts.tolist()) if c} == {1, 3, 5, 7}


def test_greedy_draws_only_the_argmax() -> None:
    counts = draw(0.0, 1.0, seed=0)
    assert counts[1] == NUM_DRAWS
