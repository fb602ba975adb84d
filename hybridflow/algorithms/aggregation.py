"""Loss aggregation over response tokens: token-mean, seq-mean-token-sum, seq-mean-token-mean.

``num_tokens`` / ``num_seqs`` are the normalisers. Left as None they are the counts in the
given tensors (the plain per-batch mean). Passing the counts of the *whole* batch makes each
call a partial sum: summing the results over micro-batches (and over data-parallel ranks)
gives exactly the full-batch value. This module knows nothing about ranks or gradients.
"""

from __future__ import annotations

from typing import Final

import torch

LOSS_AGG_MODES: Final[tuple[str, ...]] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
"""Supported aggregation modes (verl's names)."""


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Aggregate a ``[batch, tokens]`` loss matrix over valid tokens into a scalar.

    - ``token-mean``: sum over all valid tokens / number of valid tokens.
    - ``seq-mean-token-sum``: per-sequence token sum, averaged over sequences.
    - ``seq-mean-token-mean``: per-sequence token mean, averaged over sequences.

    Rows whose mask is all zero (padding rows) contribute nothing and are not counted.
    """
    mask = mask.to(loss_mat.dtype)
    masked = loss_mat * mask
    if mode == "token-mean":
        denom = mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens
        return masked.sum() / denom
    seq_tokens = mask.sum(dim=-1)
    if mode == "seq-mean-token-sum":
        seq_losses = masked.sum(dim=-1)
    elif mode == "seq-mean-token-mean":
        seq_losses = masked.sum(dim=-1) / seq_tokens.clamp(min=1.0)
    else:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {mode!r}")
    if num_seqs is None:
        return seq_losses.sum() / (seq_tokens > 0).to(loss_mat.dtype).sum().clamp(min=1.0)
    return seq_losses.sum() / num_seqs


def masked_mean_contribution(
    values: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None
) -> torch.Tensor:
    """Token-mean of ``values`` over valid tokens (a metric); a partial sum when ``num_tokens`` is global."""
    return agg_loss(values, mask, "token-mean", num_tokens=num_tokens)
