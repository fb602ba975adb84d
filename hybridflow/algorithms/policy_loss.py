"""Clipped PPO policy loss with asymmetric clipping (clip-higher) and dual-clip.

Per token, with ``ratio = exp(logp - old_logp)`` and advantage ``A``:
``L = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high))``; for ``A < 0`` dual-clip caps it
at ``-A * clip_ratio_c``. The token losses are aggregated by ``loss_agg_mode``. Nothing here
knows about models, micro-batches or ranks; global normalisers make results additive.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.aggregation import agg_loss

LOG_RATIO_CLAMP = 20.0
"""Bound on |logp - old_logp| before exp (no overflow on a wild token)."""


@dataclass
class PolicyLossOutput:
    """Scalar tensors of one policy-loss evaluation."""

    loss: torch.Tensor
    """Aggregated clipped policy-gradient loss (differentiable)."""
    pg_clipfrac: torch.Tensor
    """Token fraction where the clipped term was active (upper or lower clip)."""
    pg_clipfrac_lower: torch.Tensor
    """Token fraction where the dual-clip bound (``A < 0``) was active."""
    ppo_kl: torch.Tensor
    """Token mean of ``old_logp - logp`` (approximate KL from the old policy)."""


def compute_policy_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """Clipped PPO loss over ``[batch, tokens]`` tensors.

    ``token_weights`` (detached, e.g. off-policy importance weights) scale each token's loss.

    ``clip_ratio_c`` (> 1) enables dual-clip; None disables it. ``num_tokens`` / ``num_seqs``
    are global normalisers (see ``aggregation``); the fraction metrics are token means.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None), got {clip_ratio_c}")
    mask = response_mask.to(logprob.dtype)
    neg_approx_kl = torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(neg_approx_kl)
    ppo_kl = agg_loss(-neg_approx_kl.detach(), mask, "token-mean", num_tokens=num_tokens)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = agg_loss(
        torch.gt(pg_losses2, pg_losses1).to(mask.dtype), mask, "token-mean", num_tokens=num_tokens
    )
    if clip_ratio_c is None:
        pg_losses = clipped
        pg_clipfrac_lower = torch.zeros((), dtype=mask.dtype, device=mask.device)
    else:
        pg_losses3 = -advantages * clip_ratio_c
        dual = torch.minimum(pg_losses3, clipped)
        lower_active = torch.gt(clipped, pg_losses3) & (advantages < 0)
        pg_clipfrac_lower = agg_loss(
            lower_active.to(mask.dtype), mask, "token-mean", num_tokens=num_tokens
        )
        pg_losses = torch.where(advantages < 0, dual, clipped)
    if token_weights is not None:
        pg_losses = pg_losses * token_weights
    loss = agg_loss(pg_losses, mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    return PolicyLossOutput(
        loss=loss,
        pg_clipfrac=pg_clipfrac.detach(),
        pg_clipfrac_lower=pg_clipfrac_lower.detach(),
        ppo_kl=ppo_kl,
    )
