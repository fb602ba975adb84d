"""The sampling contract's distribution, computed independently of the sampler (float64 numpy),
and Pearson chi-square tests for the sampler checks: one sample against a distribution, and two
samples against each other, with p-values from the chi-square survival function
(``torch.special.gammaincc``; scipy is not a dependency).

Cells whose expected count is below ``MIN_EXPECTED`` are pooled into one cell (the usual rule
for the chi-square approximation); a cell with expected probability 0 must be empty, else the
p-value is 0. The sampler tests draw with fixed seeds, so each statistic is a fixed number and
a threshold on its p-value is a deterministic check, not a flaky one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

MIN_EXPECTED = 5.0
"""Pool cells expected to hold fewer draws than this."""
P_ACCEPT = 1e-3
"""A seeded sample from the intended distribution must give a p-value above this."""
P_REJECT = 1e-6
"""A near-miss distribution must give a p-value below this (the test's power)."""


def tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T)."""
    z = logits / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def nucleus_size(probs: np.ndarray, top_p: float) -> int:
    """How many of the most likely tokens the nucleus keeps (mass before each < top_p)."""
    mass_before = np.cumsum(np.sort(probs)[::-1]) - np.sort(probs)[::-1]
    if top_p < 1.0:
        assert np.abs(mass_before - top_p).min() > 1e-3, "a boundary float rounding could move"
    return max(1, int((mass_before < top_p).sum())) if top_p < 1.0 else probs.size


def truncated(probs: np.ndarray, size: int) -> np.ndarray:
    """``probs`` cut to its ``size`` most likely entries, renormalised."""
    order = np.argsort(-probs, kind="stable")
    out = np.zeros_like(probs)
    out[order[:size]] = probs[order[:size]]
    return out / out.sum()


def intended(
    logits: np.ndarray,
    temperature: float,
    top_p: float,
    keep: int | None = None,
    top_k: int = 0,
) -> torch.Tensor:
    """The contract's distribution over ``logits [vocab]``: softmax(logits / T), cut to the
    ``top_k`` most likely tokens (0: all) and renormalised, then cut to the nucleus of that
    (``nucleus_size``; ``keep`` overrides its size, for near misses), renormalised."""
    probs = tempered(logits, temperature)
    if 0 < top_k < probs.size:
        probs = truncated(probs, top_k)
    size = nucleus_size(probs, top_p) if keep is None else keep
    return torch.from_numpy(truncated(probs, size))


@dataclass(frozen=True)
class ChiSquare:
    """A chi-square statistic, its degrees of freedom and its p-value."""

    statistic: float
    dof: int
    p_value: float

    def __str__(self) -> str:
        return f"chi2={self.statistic:.2f} dof={self.dof} p={self.p_value:.3g}"


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof)."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    a = torch.tensor(dof / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(statistic / 2.0, dtype=torch.float64)))


def counts_of(tokens: Sequence[int] | torch.Tensor, size: int) -> torch.Tensor:
    """``[size]`` float64 histogram of token ids."""
    ids = torch.as_tensor(tokens, dtype=torch.int64).flatten()
    return torch.bincount(ids, minlength=size).double()


def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> ChiSquare:
    """Pearson's test of ``counts [k]`` against the distribution ``probs [k]`` (sums to 1)."""
    counts, probs = counts.double(), probs.double()
    total = float(counts.sum())
    impossible = probs <= 0
    if bool((counts[impossible] > 0).any()):
        return ChiSquare(float("inf"), max(int((~impossible).sum()) - 1, 1), 0.0)
    expected = probs * total
    small = (expected < MIN_EXPECTED) & ~impossible
    big = (expected >= MIN_EXPECTED) & ~impossible
    obs = [counts[big], counts[small].sum().reshape(1)] if bool(small.any()) else [counts[big]]
    exp = (
        [expected[big], expected[small].sum().reshape(1)] if bool(small.any()) else [expected[big]]
    )
    o, e = torch.cat(obs), torch.cat(exp)
    if e.numel() < 2:
        raise ValueError("fewer than two cells: nothing to test")
    stat = float(((o - e) ** 2 / e).sum())
    dof = int(e.numel()) - 1
    return ChiSquare(stat, dof, chi2_sf(stat, dof))


def two_sample(counts_a: torch.Tensor, counts_b: torch.Tensor) -> ChiSquare:
    """Pearson's test that two histograms over the same cells come from one distribution
    (the 2 x k contingency table); cells pooled by their expected count under the pooled
    distribution."""
    a, b = counts_a.double(), counts_b.double()
    n_a, n_b = float(a.sum()), float(b.sum())
    pooled = (a + b) / (n_a + n_b)
    smaller = min(n_a, n_b)
    small = (pooled * smaller < MIN_EXPECTED) & (pooled > 0)
    big = pooled * smaller >= MIN_EXPECTED
    rows_a, rows_b = [a[big]], [b[big]]
    if bool(small.any()):
        rows_a.append(a[small].sum().reshape(1))
        rows_b.append(b[small].sum().reshape(1))
    table = torch.stack([torch.cat(rows_a), torch.cat(rows_b)])
    if table.shape[1] < 2:
        raise ValueError("fewer than two cells: nothing to test")
    col = table.sum(0, keepdim=True)
    row = table.sum(1, keepdim=True)
    expected = row * col / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    dof = int(table.shape[1]) - 1
    return ChiSquare(stat, dof, chi2_sf(stat, dof))
