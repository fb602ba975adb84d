"""Preference and supervised losses as pure tensor functions: DPO, KTO, ORPO, SFT.

Inputs are *sequence* log-probs (the sum of a completion's token log-probs, TRL's default)
under the policy and the frozen reference; outputs are per-example losses (callers choose the
normaliser, so that sums over data-parallel ranks equal the single-process mean) and the
implicit rewards ``beta * (log pi - log pi_ref)`` that TRL reports as ``rewards/*``.

- DPO (Rafailov et al. 2023, eq. 7; TRL ``loss_type="sigmoid"``):
  ``h = (pi_c - pi_r) - (ref_c - ref_r)``,
  ``loss = -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)`` (eps: label smoothing,
  the conservative DPO of Mitchell 2023; 0 gives the paper's loss).
  Its variants on the same ``h`` (``dpo_loss(loss_type=...)``):
  - ``hinge`` (SLiC-HF, Zhao et al. 2023; TRL ``"hinge"``): ``max(0, 1 - beta h)``;
  - ``ipo`` (Azar et al. 2023, eq. 17; TRL ``"ipo"``): ``(h - 1 / (2 beta))^2``, which
    regresses the margin to a fixed target instead of pushing it without bound. As in TRL,
    its log-probs are token means (``sequence_logprobs(..., mean=True)``), not sums.
- KTO (Ethayarajh et al. 2024, eq. 8; TRL ``KTOTrainer.kto_loss``): with the reference point
  ``z0 = max(0, KL)`` (a detached batch estimate of KL(pi || pi_ref) from mismatched
  prompt/completion pairs) and ``r = pi - ref``: desirable ``w_d (1 - sigma(beta (r - z0)))``,
  undesirable ``w_u (1 - sigma(beta (z0 - r)))``.
- ORPO (Hong et al. 2024, eqs. 6-7; TRL ``ORPOTrainer.odds_ratio_loss``), no reference:
  with ``l_c, l_r`` the *token-mean* log-probs of chosen and rejected and
  ``log odds(y) = l - log(1 - exp(l))``, the per-pair odds-ratio term is
  ``-log sigma(log odds(y_c) - log odds(y_r))``; the loss is the NLL of the chosen tokens
  plus ``lambda`` times its mean (``orpo_loss`` returns the term; the caller adds the NLL,
  whose token normaliser it owns).
- SFT: negative log-likelihood of the response tokens, summed (callers divide by the global
  token count for a token mean).

Nothing here knows about models, padding beyond a mask, ranks or data formats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DPO_MARGIN_LOSSES: tuple[str, ...] = ("sigmoid", "hinge", "ipo")
"""The losses on the DPO margin ``dpo_loss`` implements (the config's ``dpo_loss_type``
names exactly these; a test keeps the two equal)."""


@dataclass
class DPOLossOutput:
    """Per-pair DPO loss and the (detached) implicit rewards, each ``[pairs]``."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


@dataclass
class ORPOLossOutput:
    """Per-pair odds-ratio term ``-log sigma(log odds ratio)`` (not yet times lambda) and the
    detached log odds ratio, each ``[pairs]``."""

    losses: torch.Tensor
    log_odds_ratio: torch.Tensor


@dataclass
class KTOLossOutput:
    """Per-example KTO loss (weights applied) and detached implicit rewards, each ``[n]``."""

    losses: torch.Tensor
    rewards: torch.Tensor


def sequence_logprobs(
    token_logprobs: torch.Tensor, mask: torch.Tensor, mean: bool = False
) -> torch.Tensor:
    """``[rows]`` sum (or, with ``mean``, mean) of ``token_logprobs [rows, tokens]`` where
    ``mask`` is 1."""
    weights = mask.to(token_logprobs.dtype)
    total = (token_logprobs * weights).sum(-1)
    return total / weights.sum(-1).clamp(min=1.0) if mean else total


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
) -> DPOLossOutput:
    """DPO loss per pair (``loss_type``: sigmoid, hinge or ipo); all inputs are ``[pairs]``
    sequence log-probs (token means for ipo). Label smoothing is sigmoid's only."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if loss_type not in DPO_MARGIN_LOSSES:
        raise ValueError(f"loss_type must be one of {DPO_MARGIN_LOSSES}, got {loss_type!r}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"label_smoothing applies to the sigmoid loss, not {loss_type}")
    logits = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    if loss_type == "hinge":
        losses = torch.relu(1.0 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1.0 / (2.0 * beta)) ** 2
    else:
        losses = (
            -F.logsigmoid(beta * logits) * (1.0 - label_smoothing)
            - F.logsigmoid(-beta * logits) * label_smoothing
        )
    return DPOLossOutput(
        losses=losses,
        chosen_rewards=beta * (policy_chosen - ref_chosen).detach(),
        rejected_rewards=beta * (policy_rejected - ref_rejected).detach(),
    )


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, stable on both sides of ``-log 2`` (Maechler 2012:
    ``log1p(-exp(x))`` far from 0, ``log(-expm1(x))`` near it)."""
    return torch.where(x < -math.log(2.0), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor) -> ORPOLossOutput:
    """ORPO's odds-ratio term per pair; inputs are ``[pairs]`` token-mean log-probs (< 0).

    ``log odds(y) = l - log(1 - exp(l))``, so ``log OR = (l_c - l_r) - (log1mexp(l_c) -
    log1mexp(l_r))``; the term is ``-log sigma(log OR)``. Computed in fp32 (TRL casts too)."""
    chosen, rejected = policy_chosen.float(), policy_rejected.float()
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    return ORPOLossOutput(losses=-F.logsigmoid(log_odds), log_odds_ratio=log_odds.detach())


def kto_reference_point(
    policy_mismatched: torch.Tensor, ref_mismatched: torch.Tensor, count: float | None = None
) -> torch.Tensor:
    """KTO's ``z0``: detached ``max(0, mean(pi - ref))`` over mismatched pairs.

    ``count`` divides the sum instead of the local row count (pass the global count when the
    sum is then all-reduced over ranks; clamp after the reduction with ``clamp(min=0)``).
    """
    diff = (policy_mismatched - ref_mismatched).detach()
    if count is None:
        return diff.mean().clamp(min=0.0)
    return diff.sum() / count


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> KTOLossOutput:
    """KTO loss per example; ``desirable`` is a bool ``[n]``, ``kl`` the reference point z0."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if desirable_weight < 0 or undesirable_weight < 0:
        raise ValueError("desirable_weight and undesirable_weight must be >= 0")
    z0 = torch.as_tensor(kl, dtype=policy_logps.dtype, device=policy_logps.device).detach()
    logratios = policy_logps - ref_logps
    desirable = desirable.to(torch.bool)
    chosen = desirable_weight * (1.0 - torch.sigmoid(beta * (logratios - z0)))
    rejected = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - logratios)))
    return KTOLossOutput(
        losses=torch.where(desirable, chosen, rejected), rewards=beta * logratios.detach()
    )


def sft_nll_sum(token_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood of the masked tokens (divide by the token count)."""
    return -(token_logprobs * mask.to(token_logprobs.dtype)).sum()
