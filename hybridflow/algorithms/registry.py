"""Advantage estimators and policy losses by name, and user ones by import path.

An estimator maps ``(AdvantageInputs, AdvantageOptions)`` to ``(advantages, returns)``, both
``[B, T]``; a policy loss maps ``(PolicyLossInputs, PolicyLossOptions)`` to a
``PolicyLossOutput`` (or a bare scalar loss tensor). The learner config names them
(``learner.advantage_estimator`` / ``learner.policy_loss``): a built-in name below, or
"package.module:function" imported when the learner starts. Estimators see the *whole* train
batch (every rank holds it), so their results need no cross-rank statistics; losses see one
micro-batch and must aggregate with the global normalisers they are given (``agg_loss``) so
sums over micro-batches and ranks equal the single-process loss. This module knows nothing
about models, ranks or the config classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import torch

from hybridflow.algorithms.advantages import (
    gae_advantages,
    grpo_batch_std_advantages,
    grpo_outcome_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    remax_advantages,
    rloo_outcome_advantages,
    whiten_tokens,
)
from hybridflow.algorithms.policy_loss import PolicyLossOutput, compute_policy_loss
from hybridflow.algorithms.seq_policy_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_gspo,
)
from hybridflow.config.import_path import is_import_path, load_callable


@dataclass(frozen=True)
class AdvantageInputs:
    """The whole train batch, right-padded to ``[B, T]``."""

    token_rewards: torch.Tensor
    """``[B, T]``: each sample's (shaped) score at its last response token, minus the per-token
    KL penalty in ``kl_mode: reward``; ``token_rewards.sum(-1)`` is the sequence score."""
    response_mask: torch.Tensor
    """``[B, T]`` 0/1: 1 on response tokens."""
    group_ids: torch.Tensor
    """``[B]`` int64: samples of one prompt share an id."""
    values: torch.Tensor | None
    """``[B, T]`` critic values at rollout time (estimators registered with a critic), else None."""
    baselines: torch.Tensor | None = None
    """``[B]`` score of the greedy response to each sample's prompt (estimators registered with
    ``needs_baseline``), else None."""


@dataclass(frozen=True)
class AdvantageOptions:
    """Settings estimators may read (from the learner config)."""

    gamma: float = 1.0
    """Discount (GAE, REINFORCE++)."""
    lam: float = 1.0
    """GAE lambda."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group std (False: Dr. GRPO)."""
    std_eps: float = 1e-6
    """Added to the std the GRPO estimators divide by."""


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch, ``[b, T]`` tensors, plus the global normalisers of its mini-batch."""

    old_logprob: torch.Tensor
    """Log-probs under the policy that the ratio is taken against (detached)."""
    logprob: torch.Tensor
    """Log-probs under the current policy (differentiable)."""
    advantages: torch.Tensor
    """Per-token advantages (detached)."""
    response_mask: torch.Tensor
    """0/1 response-token mask."""
    num_tokens: float | None = None
    """Response tokens of the whole mini-batch (``agg_loss``'s global normaliser)."""
    num_seqs: float | None = None
    """Sequences of the whole mini-batch (``agg_loss``'s global normaliser)."""
    token_weights: torch.Tensor | None = None
    """Detached off-policy importance weights to scale each token's loss, or None."""


@dataclass(frozen=True)
class PolicyLossOptions:
    """Settings losses may read (from the learner config)."""

    clip_ratio_low: float = 0.2
    """Lower clip: 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """Upper clip: 1 + clip_ratio_high."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound (PPO clip only); None disables it."""
    loss_agg_mode: str = "token-mean"
    """Aggregation mode for ``agg_loss``."""


AdvantageFn = Callable[[AdvantageInputs, AdvantageOptions], tuple[torch.Tensor, torch.Tensor]]
PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossOptions], "PolicyLossOutput | torch.Tensor"]


@dataclass(frozen=True)
class AdvantageEstimator:
    """One registered estimator."""

    name: str
    """Registered name or import path."""
    fn: AdvantageFn
    """The estimator."""
    needs_critic: bool
    """The learner loads and trains a critic and passes its values."""
    needs_baseline: bool = False
    """The learner passes each prompt's greedy baseline score (the coordinator generates one
    greedy response per prompt for it)."""


_ESTIMATORS: dict[str, AdvantageEstimator] = {}
_POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_advantage_estimator(
    name: str, *, needs_critic: bool = False, needs_baseline: bool = False
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register ``fn`` as estimator ``name`` (built-ins use it)."""

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        _ESTIMATORS[name] = AdvantageEstimator(name, fn, needs_critic, needs_baseline)
        return fn

    return decorator


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn`` as policy loss ``name`` (built-ins use it)."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        _POLICY_LOSSES[name] = fn
        return fn

    return decorator


def advantage_estimator_names() -> list[str]:
    """Registered estimator names, sorted."""
    return sorted(_ESTIMATORS)


def policy_loss_names() -> list[str]:
    """Registered policy-loss names, sorted."""
    return sorted(_POLICY_LOSSES)


def resolve_advantage_estimator(
    value: str, key: str = "learner.advantage_estimator"
) -> AdvantageEstimator:
    """A registered name, or import "module:function" now; ValueError naming ``key`` if bad.

    Imported estimators get no critic and no greedy baseline (``inputs.values`` and
    ``inputs.baselines`` are None).
    """
    if value in _ESTIMATORS:
        return _ESTIMATORS[value]
    if not is_import_path(value):
        raise ValueError(
            f"{key}: unknown estimator {value!r}; one of {advantage_estimator_names()} "
            "or 'package.module:function'"
        )
    try:
        fn = load_callable(value, "advantage estimator", (None, None), "(inputs, options)")
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from exc
    return AdvantageEstimator(value, fn, needs_critic=False)


def resolve_policy_loss(value: str, key: str = "learner.policy_loss") -> PolicyLossFn:
    """A registered name, or import "module:function" now; ValueError naming ``key`` if bad."""
    if value in _POLICY_LOSSES:
        return _POLICY_LOSSES[value]
    if not is_import_path(value):
        raise ValueError(
            f"{key}: unknown policy loss {value!r}; one of {policy_loss_names()} "
            "or 'package.module:function'"
        )
    try:
        fn = load_callable(value, "policy loss", (None, None), "(inputs, options)")
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from exc
    return fn


def as_policy_loss_output(out: PolicyLossOutput | torch.Tensor) -> PolicyLossOutput:
    """A bare loss tensor becomes a ``PolicyLossOutput`` with zero clip/KL metrics."""
    if isinstance(out, PolicyLossOutput):
        return out
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        zero = torch.zeros((), dtype=out.dtype, device=out.device)
        return PolicyLossOutput(loss=out, pg_clipfrac=zero, pg_clipfrac_lower=zero, ppo_kl=zero)
    raise ValueError(
        f"policy loss returned {type(out).__name__}; expected PolicyLossOutput or a scalar tensor"
    )


# ---------------------------------------------------------------- built-in estimators
def _per_token(seq_adv: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    adv = seq_adv.unsqueeze(-1) * mask.to(seq_adv.dtype)
    return adv, adv


@register_advantage_estimator("gae", needs_critic=True)
def _gae(inputs: AdvantageInputs, options: AdvantageOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with the critic's values, advantages whitened over the batch's tokens."""
    if inputs.values is None:
        raise ValueError("advantage estimator 'gae' needs critic values")
    adv, returns = gae_advantages(
        inputs.token_rewards,
        inputs.values,
        inputs.response_mask,
        options.gamma,
        options.lam,
        whiten=False,
    )
    return whiten_tokens(adv, inputs.response_mask), returns


@register_advantage_estimator("grpo")
def _grpo(inputs: AdvantageInputs, options: AdvantageOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """(score - group mean) / group std on every token (Dr. GRPO when not norm_adv_by_std)."""
    scores = inputs.token_rewards.sum(dim=-1)
    seq_adv = grpo_outcome_advantages(
        scores, inputs.group_ids, eps=options.std_eps, norm_by_std=options.norm_adv_by_std
    )
    return _per_token(seq_adv, inputs.response_mask)


@register_advantage_estimator("grpo_batch_std")
def _grpo_batch_std(
    inputs: AdvantageInputs, options: AdvantageOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """(score - group mean) / batch std on every token (TRL's scale_rewards=batch)."""
    scores = inputs.token_rewards.sum(dim=-1)
    seq_adv = grpo_batch_std_advantages(scores, inputs.group_ids, eps=options.std_eps)
    return _per_token(seq_adv, inputs.response_mask)


@register_advantage_estimator("dr_grpo")
def _dr_grpo(
    inputs: AdvantageInputs, options: AdvantageOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """score - group mean on every token (no std division)."""
    scores = inputs.token_rewards.sum(dim=-1)
    return _per_token(
        grpo_outcome_advantages(scores, inputs.group_ids, norm_by_std=False),
        inputs.response_mask,
    )


@register_advantage_estimator("rloo")
def _rloo(inputs: AdvantageInputs, options: AdvantageOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """score - mean of the group's other scores on every token."""
    scores = inputs.token_rewards.sum(dim=-1)
    return _per_token(rloo_outcome_advantages(scores, inputs.group_ids), inputs.response_mask)


@register_advantage_estimator("remax", needs_baseline=True)
def _remax(inputs: AdvantageInputs, options: AdvantageOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward-to-go minus the prompt's greedy score (score - greedy score on outcome rewards)."""
    if inputs.baselines is None:
        raise ValueError("advantage estimator 'remax' needs the greedy baselines")
    return remax_advantages(inputs.token_rewards, inputs.response_mask, inputs.baselines)


@register_advantage_estimator("reinforce_plus_plus")
def _reinforce_pp(
    inputs: AdvantageInputs, options: AdvantageOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted token returns whitened over the batch."""
    return reinforce_plus_plus_advantages(inputs.token_rewards, inputs.response_mask, options.gamma)


@register_advantage_estimator("reinforce_plus_plus_baseline")
def _reinforce_pp_baseline(
    inputs: AdvantageInputs, options: AdvantageOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """score - group mean on every token, whitened over the batch."""
    scores = inputs.token_rewards.sum(dim=-1)
    adv = reinforce_plus_plus_baseline_advantages(scores, inputs.group_ids, inputs.response_mask)
    return adv, adv


# ---------------------------------------------------------------- built-in policy losses
@register_policy_loss("ppo_clip")
def _ppo_clip(inputs: PolicyLossInputs, options: PolicyLossOptions) -> PolicyLossOutput:
    """PPO's clipped token loss with clip-higher and dual-clip."""
    return compute_policy_loss(
        inputs.old_logprob,
        inputs.logprob,
        inputs.advantages,
        inputs.response_mask,
        options.clip_ratio_low,
        options.clip_ratio_high,
        options.clip_ratio_c,
        options.loss_agg_mode,
        inputs.num_tokens,
        inputs.num_seqs,
        token_weights=inputs.token_weights,
    )


@register_policy_loss("gspo")
def _gspo(inputs: PolicyLossInputs, options: PolicyLossOptions) -> PolicyLossOutput:
    """GSPO: the clip on one ratio per sequence (aggregated seq-mean-token-mean)."""
    return compute_policy_loss_gspo(
        inputs.old_logprob,
        inputs.logprob,
        inputs.advantages,
        inputs.response_mask,
        options.clip_ratio_low,
        options.clip_ratio_high,
        inputs.num_tokens,
        inputs.num_seqs,
        token_weights=inputs.token_weights,
    )


@register_policy_loss("cispo")
def _cispo(inputs: PolicyLossInputs, options: PolicyLossOptions) -> PolicyLossOutput:
    """CISPO: clipped, detached importance weight times A times the token log-prob."""
    return compute_policy_loss_cispo(
        inputs.old_logprob,
        inputs.logprob,
        inputs.advantages,
        inputs.response_mask,
        options.clip_ratio_low,
        options.clip_ratio_high,
        options.loss_agg_mode,
        inputs.num_tokens,
        inputs.num_seqs,
        token_weights=inputs.token_weights,
    )


BUILTIN_ADVANTAGE_ESTIMATORS: Final[tuple[str, ...]] = tuple(advantage_estimator_names())
"""Names registered by this module (mirrored in the learner config)."""
BUILTIN_POLICY_LOSSES: Final[tuple[str, ...]] = tuple(policy_loss_names())
"""Names registered by this module (mirrored in the learner config)."""
