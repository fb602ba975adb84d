"""Masked reductions over padded ``[batch, tokens]`` tensors (mean, variance, whitening).

A mask entry of 1 marks a real response token, 0 padding. These helpers know nothing about
what the values mean; ``masked_whiten`` accepts precomputed statistics so a caller that holds
only a slice of the batch can whiten with global (all-reduced) mean and variance.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8
"""Added to the variance before the reciprocal square root (verl's value)."""


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` where ``mask`` is 1 (Bessel-corrected when ``unbiased``)."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    if count.item() < (2 if unbiased else 1):
        raise ValueError(f"mask: need at least {2 if unbiased else 1} valid entries, got {count}")
    mean = (values * mask).sum() / count
    sq_dev = ((values - mean) ** 2 * mask).sum()
    return sq_dev / (count - 1 if unbiased else count)


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    mean: torch.Tensor | None = None,
    var: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` on valid entries, 0 on padding.

    ``mean``/``var`` default to the masked mean and unbiased variance of ``values``; pass
    global statistics when ``values`` is one rank's slice of a larger batch.
    """
    if mean is None:
        mean = masked_mean(values, mask)
    if var is None:
        var = masked_var(values, mask, unbiased=True)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS) * mask.to(values.dtype)
