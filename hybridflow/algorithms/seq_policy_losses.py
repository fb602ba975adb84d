"""Policy losses beyond PPO's token clip: GSPO (sequence-level ratio) and CISPO (clipped weight).

Same inputs and output as ``policy_loss.compute_policy_loss`` (``[batch, tokens]`` tensors,
global normalisers for additivity over micro-batches and ranks, optional detached
``token_weights``). Nothing here knows about models, micro-batches or ranks.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.algorithms.policy_loss import LOG_RATIO_CLAMP, PolicyLossOutput

_GSPO_LOG_RATIO_MAX = 10.0


def _output(
    loss: torch.Tensor,
    clipped: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float | None,
) -> PolicyLossOutput:
    """The loss with its metrics: token fraction ``clipped``, token-mean ``old_logp - logp``
    (no dual-clip here, so ``pg_clipfrac_lower`` is 0)."""
    clipfrac = agg_loss(clipped.to(mask.dtype), mask, "token-mean", num_tokens=num_tokens)
    return PolicyLossOutput(
        loss=loss,
        pg_clipfrac=clipfrac.detach(),
        pg_clipfrac_lower=torch.zeros((), dtype=mask.dtype, device=mask.device),
        ppo_kl=agg_loss(-log_ratio.detach(), mask, "token-mean", num_tokens=num_tokens),
    )


def compute_policy_loss_gspo(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """GSPO: PPO's clip applied to one importance ratio per sequence (Zheng et al., 2025).

    ``s_i = exp(mean_t(logp - old_logp))`` over the valid tokens of sequence ``i``; every token
    gets ``L = max(-A * s, -A * clip(s, 1 - low, 1 + high))``. Like verl's
    ``compute_policy_loss_gspo`` the ratio is written per token as
    ``exp(logp - sg(logp) + sg(log s_i))`` (value ``s_i``, gradient ``s_i * grad logp``; the
    log is capped at 10) and the losses are aggregated ``seq-mean-token-mean`` whatever the
    configured mode, so each sequence's gradient is ``-A s_i`` times its mean token score.
    """
    mask = response_mask.to(logprob.dtype)
    log_ratio = logprob - old_logprob
    seq_lengths = mask.sum(dim=-1).clamp(min=1.0)
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / seq_lengths
    token_log_ratio = logprob - logprob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=_GSPO_LOG_RATIO_MAX))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    if token_weights is not None:
        pg_losses = pg_losses * token_weights
    loss = agg_loss(pg_losses, mask, "seq-mean-token-mean", num_seqs=num_seqs)
    return _output(loss, torch.gt(pg_losses2, pg_losses1), log_ratio, mask, num_tokens)


def compute_policy_loss_cispo(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """CISPO: ``L = -sg(clip(ratio, 1 - low, 1 + high)) * A * logp`` per token (MiniMax-M1).

    The importance weight is clipped and detached, so no token's gradient is dropped (PPO's
    clip zeroes it); the gradient of a token is ``-w * A * grad logp``. MiniMax-M1 tunes only
    the upper bound: set ``clip_ratio_low`` close to 1 for that. Aggregated by
    ``loss_agg_mode`` (the paper uses token-mean). ``pg_clipfrac`` counts clipped weights.
    """
    mask = response_mask.to(logprob.dtype)
    log_ratio = torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio).detach()
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = -weight * advantages * logprob
    if token_weights is not None:
        pg_losses = pg_losses * token_weights
    loss = agg_loss(pg_losses, mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    return _output(loss, torch.ne(weight, ratio), log_ratio, mask, num_tokens)
