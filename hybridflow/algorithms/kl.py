"""KL estimators between the policy and a reference, per token, and the KL reward penalty.

Estimators of ``KL(pi || ref)`` from the log-probs of the sampled tokens (Schulman's k1/k2/k3):
``k1`` = ``log pi - log ref``; ``k2`` = ``0.5 * (log pi - log ref)^2`` (verl "mse");
``k3`` = ``exp(log ref - log pi) - (log ref - log pi) - 1`` (verl "low_var_kl", clamped to
[-10, 10]); ``abs`` = ``|log pi - log ref|``. verl's names are accepted as aliases.
Nothing here knows which models produced the log-probs.
"""

from __future__ import annotations

from typing import Final

import torch

KL_ESTIMATORS: Final[dict[str, str]] = {
    "k1": "k1",
    "kl": "k1",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
    "abs": "abs",
}
"""Accepted estimator names → canonical name."""

_LOG_RATIO_CLAMP = 20.0
_K3_CLAMP = 10.0


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate between policy log-probs and reference log-probs (same shape)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {sorted(KL_ESTIMATORS)}, got {estimator!r}")
    kind = KL_ESTIMATORS[estimator]
    log_ratio = logprob - ref_logprob
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio.square()
    # k3: unbiased, always >= 0, low variance; clamped like verl for numerical safety.
    ref_ratio = torch.clamp(-log_ratio, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    kld = torch.exp(ref_ratio) - ref_ratio - 1
    return torch.clamp(kld, min=-_K3_CLAMP, max=_K3_CLAMP)


def apply_kl_penalty(
    token_scores: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL as a reward penalty: ``rewards = scores - kl_coef * kl`` per valid token.

    Returns ``(token_rewards, kl)`` with ``kl`` zeroed on padding.
    """
    kl = kl_penalty(logprob, ref_logprob, estimator) * response_mask.to(logprob.dtype)
    return token_scores - kl_coef * kl, kl
