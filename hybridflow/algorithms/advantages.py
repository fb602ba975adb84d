"""Advantage estimators: GRPO / Dr. GRPO, RLOO, REINFORCE++ (and its group baseline), ReMax,
GAE.

Inputs are tensors: per-sample scores with group ids, or per-token rewards and values over a
``[batch, tokens]`` response layout with a 0/1 response mask. Nothing here knows where the
scores came from, which model produced the values, or how the batch is split across ranks.
"""

from __future__ import annotations

import torch

from hybridflow.algorithms.masked import masked_whiten


def grpo_outcome_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """Per-sample GRPO advantage: ``(score - group mean) / (group std + eps)``.

    ``scores [B]`` float, ``group_ids [B]`` int (samples of one prompt share an id). The std is
    the unbiased (Bessel-corrected) one, as ``torch.std``. With ``norm_by_std=False`` the
    advantage is ``score - group mean`` (Dr. GRPO). A group of one sample has mean 0 and std 1,
    so its advantage is its score (verl's convention).
    """
    _check_outcome_inputs(scores, group_ids)
    scores = scores.float()
    inverse, counts, means, stds = _group_stats(scores, group_ids)
    singleton = counts == 1
    means = torch.where(singleton, torch.zeros_like(means), means)
    stds = torch.where(singleton, torch.ones_like(stds), stds)
    centred = scores - means[inverse]
    if not norm_by_std:
        return centred
    return centred / (stds[inverse] + eps)


def grpo_batch_std_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """``(score - group mean) / (batch std + eps)``: centred in the group, scaled by the
    unbiased std of every score in the batch (TRL's ``scale_rewards="batch"``; the "group
    mean, batch std" of Lite PPO). A group of one has mean 0, as in ``grpo_outcome_advantages``.
    """
    _check_outcome_inputs(scores, group_ids)
    scores = scores.float()
    inverse, counts, means, _ = _group_stats(scores, group_ids)
    means = torch.where(counts == 1, torch.zeros_like(means), means)
    std = scores.std() if scores.numel() > 1 else torch.zeros(())
    return (scores - means[inverse]) / (std + eps)


def _group_stats(
    scores: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample its group index; per group the count, mean and unbiased std of ``scores``."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    counts = torch.zeros(num_groups, dtype=scores.dtype).index_add_(
        0, inverse, torch.ones_like(scores)
    )
    sums = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, inverse, scores)
    means = sums / counts
    sq_dev = torch.zeros(num_groups, dtype=scores.dtype).index_add_(
        0, inverse, (scores - means[inverse]) ** 2
    )
    stds = torch.sqrt(sq_dev / (counts - 1).clamp(min=1.0))
    return inverse, counts, means, stds


def _check_outcome_inputs(scores: torch.Tensor, group_ids: torch.Tensor) -> None:
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must be 1-D of equal length, got {tuple(scores.shape)} "
            f"and {tuple(group_ids.shape)}"
        )


def rloo_outcome_advantages(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per-sample RLOO advantage: ``score - mean of the other scores of its group``.

    For a group of ``n > 1`` that is ``n / (n - 1) * (score - group mean)`` (verl's
    ``compute_rloo_outcome_advantage``); a group of one keeps its score (baseline 0).
    """
    _check_outcome_inputs(scores, group_ids)
    scores = scores.float()
    inverse, counts, means, _ = _group_stats(scores, group_ids)
    n = counts[inverse]
    loo = (scores - means[inverse]) * n / (n - 1).clamp(min=1.0)
    return torch.where(n > 1, loo, scores)


def whiten_tokens(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``masked_whiten`` with mean and unbiased variance accumulated in float64.

    Every token counts once (a long response weighs more than a short one), as verl's
    ``masked_whiten``; needs at least two valid tokens.
    """
    mask = mask.to(values.dtype)
    count = mask.double().sum()
    if count.item() < 2:
        raise ValueError(f"advantage whitening needs >= 2 response tokens, got {int(count)}")
    mean = (values.double() * mask).sum() / count
    var = ((values.double() - mean) ** 2 * mask).sum() / (count - 1)
    return masked_whiten(values, mask, mean.to(values.dtype), var.to(values.dtype))


def reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns whitened over every response token of the batch.

    ``G_t = r_t + gamma * G_{t+1}`` within each response (verl's
    ``compute_reinforce_plus_plus_outcome_advantage``); the advantage is ``G`` whitened with
    the batch's token mean and variance (no critic, no group baseline). Returns
    ``(advantages, returns)``; with outcome rewards and ``gamma = 1`` every token of a
    response carries its score before whitening.
    """
    if token_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_rewards and response_mask must share a shape, got "
            f"{tuple(token_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    mask = response_mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[-1])):
        # Masked positions are skipped (the return carries over them, as in GAE): holes in
        # the mask (multi-turn observation tokens) behave like absent tokens.
        m = mask[:, t]
        running = (token_rewards[:, t] + gamma * running) * m + running * (1 - m)
        returns[:, t] = running * m
    return whiten_tokens(returns, mask), returns


def reinforce_plus_plus_baseline_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++ with a group baseline: ``score - group mean``, whitened over the batch.

    Each response token carries its sample's mean-centred score (a group of one keeps its
    score), then all tokens of the batch are whitened together (verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``). Returns ``[B, T]``.
    """
    _check_outcome_inputs(scores, group_ids)
    scores = scores.float()
    inverse, counts, means, _ = _group_stats(scores, group_ids)
    centred = torch.where(counts[inverse] > 1, scores - means[inverse], scores)
    mask = response_mask.to(scores.dtype)
    return whiten_tokens(centred.unsqueeze(-1) * mask, mask)


def remax_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, baselines: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: each token's reward-to-go minus its prompt's greedy baseline score.

    ``baselines [B]`` is the score of the greedy response to each sample's prompt. Returns
    ``(advantages, returns)`` with ``returns`` the undiscounted reward-to-go within each
    response (verl's ``compute_remax_outcome_advantage``); with outcome rewards every token of
    a response carries ``score - baseline``. No group or batch statistic enters.
    """
    if token_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_rewards and response_mask must share a shape, got "
            f"{tuple(token_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    if baselines.shape != token_rewards.shape[:1]:
        raise ValueError(
            f"baselines must be [{token_rewards.shape[0]}], got {tuple(baselines.shape)}"
        )
    mask = response_mask.to(token_rewards.dtype)
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    advantages = returns - baselines.to(token_rewards.dtype).unsqueeze(-1) * mask
    return advantages, returns


def last_token_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards ``[B, T]``: each sample's score at its last valid response token
    (the last 1 of its mask row, wherever holes are: multi-turn observation tokens)."""
    valid = response_mask > 0
    if bool((~valid.any(dim=-1)).any()):
        raise ValueError("response_mask: every sample needs at least one response token")
    out = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.arange(response_mask.shape[0], device=scores.device)
    slots = torch.arange(response_mask.shape[-1], device=scores.device)
    last = torch.where(valid, slots, -1).max(dim=-1).values
    out[rows, last] = scores
    return out


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens; returns ``(advantages, returns)``.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t+1}``,
    with ``V`` and ``A`` past the last valid token taken as 0. Masked positions are skipped (the
    recursion carries over them), so holes in the mask behave like absent tokens.
    ``returns = A + V`` before whitening; ``whiten`` normalises the advantages to zero mean and
    unit variance over valid tokens (local statistics: a data-parallel caller passes
    ``whiten=False`` and whitens with global statistics via ``masked_whiten``).
    """
    if token_rewards.shape != values.shape or values.shape != response_mask.shape:
        raise ValueError(
            "token_rewards, values and response_mask must share a shape, got "
            f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(response_mask.shape)}"
        )
    mask = response_mask.to(values.dtype)
    num_tokens = values.shape[-1]
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    advantages_reversed: list[torch.Tensor] = []
    for t in reversed(range(num_tokens)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        m = mask[:, t]
        next_value = values[:, t] * m + next_value * (1 - m)
        last_gae = gae * m + last_gae * (1 - m)
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=-1) * mask
    returns = (advantages + values) * mask
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns
