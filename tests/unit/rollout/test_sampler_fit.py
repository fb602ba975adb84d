"""The HF engine's sampler draws from the intended distribution: a chi-square goodness-of-fit
test over 20,000 seeded draws per setting, against a distribution computed here independently
(float64 numpy, not the sampler's code), and the same test rejecting near-miss distributions
(temperature off by 20 %, a nucleus one token too large or too small, top-k off by one, top-p
applied before top-k).

The intended distribution (our contract, ``hybridflow/services/rollout/sampler.py``): softmax of
``logits / T``; with ``top_k > 0`` cut to the ``top_k`` most likely tokens and renormalised
(HF's ``TopKLogitsWarper``, vLLM); then, with ``top_p < 1``, cut to the nucleus of that: the
smallest set of most likely tokens whose mass reaches ``top_p`` (a token is kept iff the mass
strictly before it, in descending order, is below ``top_p``: HF's ``TopPLogitsWarper`` and
vLLM keep the same set), renormalised. Temperature, top-k, top-p: the order of ``transformers``
and vLLM. Settings keep every cumulative mass at least 1e-3 away from ``top_p``, so float
rounding cannot move the boundary; the top-k settings include ones where top-p cuts inside the
k tokens and ones where top-k is the binding cut.

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
    truncated,
)

NUM_DRAWS = 20_000
PROBS = [0.08, 0.30, 0.02, 0.16, 0.06, 0.22, 0.04, 0.12]  # shuffled to exercise the sort
LOGITS = np.log(np.asarray(PROBS))
SETTINGS = [
    (1.0, 1.0, 0),
    (0.7, 1.0, 0),
    (1.6, 1.0, 0),
    (1.0, 0.75, 0),
    (1.3, 0.8, 0),
    (0.5, 0.9, 0),
    # top-k alone: the 3, 5, 3 most likely tokens; 7 of 8 (only the 0.02 token cut)
    (1.0, 1.0, 3),
    (0.7, 1.0, 5),
    (0.5, 1.0, 3),
    (1.0, 1.0, 7),
    # top-k then top-p: the nucleus (of the renormalised k tokens) is 4 of k = 5, with k +- 1
    # giving 3 and 5; 3 of k = 4 (top-p first would keep 4); all k = 3 (top-k binds)
    (1.6, 0.8, 5),
    (0.7, 0.85, 4),
    (1.0, 0.9, 3),
]
"""(temperature, top_p, top_k); setting i draws with seed i (one shared seed would correlate
them)."""
TOP_K = [s for s in SETTINGS if s[2]]


def draw(temperature: float, top_p: float, seed: int, top_k: int = 0) -> torch.Tensor:
    logits = torch.from_numpy(LOGITS).float().repeat(NUM_DRAWS, 1)
    gen = torch.Generator().manual_seed(seed)
    tokens, _ = sample_tokens(logits, temperature, top_p, gen, top_k)
    return counts_of(tokens, len(PROBS))


def top_p_before_top_k(temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """The wrong order: the nucleus of the full tempered distribution, then its top_k."""
    probs = tempered(LOGITS, temperature)
    return torch.from_numpy(truncated(probs, min(top_k, nucleus_size(probs, top_p))))


def near_misses(temperature: float, top_p: float, top_k: int) -> dict[str, torch.Tensor]:
    """Wrong distributions close to the intended one, each different from it."""
    right = intended(LOGITS, temperature, top_p, top_k=top_k)
    wrong = {"T x 1.2": intended(LOGITS, 1.2 * temperature, top_p, top_k=top_k)}
    if top_p < 1.0:
        probs = tempered(LOGITS, temperature)
        if top_k:
            probs = truncated(probs, top_k)
        size = nucleus_size(probs, top_p)
        for k in (size - 1, size + 1):
            if 0 < k <= int((probs > 0).sum()):
                wrong[f"nucleus of {k}"] = intended(LOGITS, temperature, top_p, k, top_k)
    if top_k:
        for k in (top_k - 1, top_k + 1):
            if 0 < k:
                wrong[f"top_k {k}"] = intended(LOGITS, temperature, top_p, top_k=k)
        if top_p < 1.0:
            wrong["top-p first"] = top_p_before_top_k(temperature, top_p, top_k)
    return {name: p for name, p in wrong.items() if not torch.allclose(p, right, atol=1e-12)}


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_draws_fit_the_intended_distribution(temperature: float, top_p: float, top_k: int) -> None:
    counts = draw(temperature, top_p, SETTINGS.index((temperature, top_p, top_k)), top_k)
    fit = goodness_of_fit(counts, intended(LOGITS, temperature, top_p, top_k=top_k))
    assert fit.p_value > P_ACCEPT, fit


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_the_same_draws_reject_a_near_miss(temperature: float, top_p: float, top_k: int) -> None:
    """The test has power: a 20 % temperature error, a nucleus off by one, top-k off by one or
    top-p applied before top-k (wherever they change the distribution) is rejected."""
    counts = draw(temperature, top_p, SETTINGS.index((temperature, top_p, top_k)), top_k)
    wrong = near_misses(temperature, top_p, top_k)
    if top_k:  # every top-k setting is checked against a k off by one
        assert any(name.startswith("top_k") for name in wrong), wrong
    for name, probs in wrong.items():
        fit = goodness_of_fit(counts, probs)
        assert fit.p_value < P_REJECT, (name, fit)


def test_the_top_k_settings_test_the_order_and_both_neighbours_of_k() -> None:
    """Somewhere top-p first is told apart, and somewhere both k - 1 and k + 1 are."""
    names = [set(near_misses(*s)) for s in TOP_K]
    assert any("top-p first" in n for n in names)
    assert any({f"top_k {s[2] - 1}", f"top_k {s[2] + 1}"} <= n for s, n in zip(TOP_K, names))
    assert any(
        {f"top_k {s[2] - 1}", f"top_k {s[2] + 1}"} <= n and s[1] < 1 for s, n in zip(TOP_K, names)
    )


def test_tokens_outside_the_nucleus_are_never_drawn() -> None:
    counts = draw(1.0, 0.75, seed=3)  # nucleus: 0.30, 0.22, 0.16, 0.12 (mass before 0.68)
    assert {i for i, c in enumerate(counts.tolist()) if c} == {1, 3, 5, 7}


def test_tokens_outside_the_top_k_are_never_drawn() -> None:
    counts = draw(1.0, 1.0, seed=6, top_k=3)  # 0.30, 0.22, 0.16
    assert {i for i, c in enumerate(counts.tolist()) if c} == {1, 3, 5}
    counts = draw(1.0, 1.0, seed=6, top_k=1)  # top-k 1 is the argmax, whatever the draw
    assert counts[1] == NUM_DRAWS


def test_greedy_draws_only_the_argmax() -> None:
    counts = draw(0.0, 1.0, seed=0)
    assert counts[1] == NUM_DRAWS
    assert draw(0.0, 1.0, seed=0, top_k=3)[1] == NUM_DRAWS
