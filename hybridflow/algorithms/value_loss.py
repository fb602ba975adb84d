"""Clipped value (critic) loss.

``vf_loss = 0.5 * agg(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2))`` over response
tokens, where ``v`` are the critic's new predictions, ``v_old`` the values at rollout time and
``R`` the returns. Nothing here knows about the critic model or ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algorithms.aggregation import agg_loss


@dataclass
class ValueLossOutput:
    """Scalar tensors of one value-loss evaluation."""

    loss: torch.Tensor
    """Aggregated clipped value loss (differentiable), including the 0.5 factor."""
    vf_clipfrac: torch.Tensor
    """Token fraction where the clipped term was the larger one."""


def compute_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    value_clip: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> ValueLossOutput:
    """Clipped value loss over ``[batch, tokens]``; ``value_clip=None`` disables clipping."""
    mask = response_mask.to(vpreds.dtype)
    vf_losses1 = (vpreds - returns) ** 2
    if value_clip is None:
        losses = vf_losses1
        clipfrac = torch.zeros((), dtype=mask.dtype, device=mask.device)
    else:
        vpred_clipped = torch.clamp(vpreds, old_values - value_clip, old_values + value_clip)
        vf_losses2 = (vpred_clipped - returns) ** 2
        losses = torch.maximum(vf_losses1, vf_losses2)
        clipfrac = agg_loss(
            torch.gt(vf_losses2, vf_losses1).to(mask.dtype), mask, "token-mean", num_tokens
        )
    loss = 0.5 * agg_loss(losses, mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    return ValueLossOutput(loss=loss, vf_clipfrac=clipfrac.detach())
