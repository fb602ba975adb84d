"""The phases of one learner train step on this rank: precompute, advantages, updates.

Every loss term is normalised by the *global* token / sequence count of its mini-batch (known
to every rank, since every rank receives the whole batch) and scaled by the size of the group
its model is sharded over before ``backward``: FSDP2 averages gradients over that group, so
summing over micro-batches and ranks gives exactly the single-process gradient. Metrics are
partial sums reduced at the end. With the critic on its own ranks (``roles``) the actor ranks
precompute log-probs and run actor updates, the critic ranks values and critic updates; the
per-sample values and KL penalties are gathered over the whole world, so every rank runs the
estimator on the same inputs.
This module knows nothing about gRPC, checkpoints or how the models were loaded.

It is one module (~470 lines) because its phases share ``UpdateContext`` and its cache; the
two long functions (``actor_update``, ``compute_advantages``) each read as one pass over a
mini-batch or the batch, and their parts are already the algorithm registry's functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from hybridflow.algorithms.advantages import last_token_scores
from hybridflow.algorithms.aggregation import agg_loss
from hybridflow.algorithms.kl import kl_penalty
from hybridflow.algorithms.off_policy import importance_weights
from hybridflow.algorithms.overlong import overlong_penalty
from hybridflow.algorithms.registry import (
    AdvantageEstimator,
    AdvantageInputs,
    AdvantageOptions,
    PolicyLossFn,
    PolicyLossInputs,
    PolicyLossOptions,
    as_policy_loss_output,
)
from hybridflow.algorithms.value_loss import compute_value_loss
from hybridflow.models.router_replay import batch_routing
from hybridflow.services.learner.batch_plans import MicroBatch, StepPlan, plan_step_micro_batches
from hybridflow.services.learner.batching import PaddedBatch, PromptSharing, build_batch
from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.distributed import all_gather_objects
from hybridflow.services.learner.forward import policy_forward, value_forward
from hybridflow.services.learner.fsdp import clip_grad_norm
from hybridflow.services.learner.metrics import StepMetrics, masked_extrema
from hybridflow.types import TrainSample

Cache = dict[str, dict[int, torch.Tensor]]
"""Per-sample tensors by kind ("old_logp", "ref_logp", "values") and global sample index."""


@dataclass
class UpdateContext:
    """What the phases share: config, batch, plan, device and the metric accumulator."""

    config: LearnerConfig
    samples: list[TrainSample]
    plan: StepPlan
    device: torch.device
    pad_id: int
    world_size: int
    """Ranks of the group this rank's models are sharded over (the loss scale)."""
    metrics: StepMetrics
    policy_loss: PolicyLossFn
    """The configured policy loss (resolved from ``config.policy_loss``)."""
    sharing: PromptSharing | None = None
    """When micro-batches share prompts (``learner.memory.shared_prompts``; the worker's
    ``prompt_sharing``); None: every sample in its own row."""
    _grad_norms: dict[str, list[float]] = field(default_factory=dict)

    def batch(self, micro: MicroBatch) -> PaddedBatch:
        rows = [self.samples[i] for i in micro.indices]
        batch = build_batch(
            [s.prompt_ids for s in rows],
            [s.response_ids for s in rows],
            self.pad_id,
            self.device,
            micro.weights,
            packed=self.config.memory.packing,
            loss_masks=[s.loss_mask for s in rows],
            sharing=self.sharing,
        )
        if self.config.moe_router_replay:  # the samples' routing was checked on arrival
            if batch.packed:  # each sequence's routing at its own tokens, back to back
                batch.routed_experts = torch.cat(
                    [
                        batch_routing([s.routed_experts], length, self.device)
                        for s, length in zip(rows, self.lengths(micro.indices), strict=True)
                    ]
                )
            else:
                batch.routed_experts = batch_routing(
                    [s.routed_experts for s in rows], batch.input_ids.shape[1], self.device
                )
        return batch

    def lengths(self, indices: Sequence[int] | None = None) -> list[int]:
        """Prompt + response tokens of the samples at ``indices`` (None: all)."""
        picked = self.samples if indices is None else [self.samples[i] for i in indices]
        return [len(s.prompt_ids) + len(s.response_ids) for s in picked]

    def plan_micro(
        self, rank_slices: Sequence[Sequence[int]], filler_index: int
    ) -> list[MicroBatch]:
        """This rank's micro-batches of ``rank_slices`` (rows, or ``learner.memory``'s token
        budget), as many as every other rank's."""
        return plan_step_micro_batches(
            rank_slices,
            self.plan.rank,
            self.config.update.micro_batch_size,
            filler_index,
            self.lengths(),
            self.config.memory.max_tokens_per_micro_batch,
        )

    def logprobs(
        self, model: nn.Module, batch: PaddedBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``policy_forward`` at the configured temperature and log-prob chunk."""
        cfg = self.config
        return policy_forward(model, batch, cfg.temperature, with_entropy, cfg.memory.head_chunk)

    def stack(
        self, per_sample: dict[int, torch.Tensor], micro: MicroBatch, width: int
    ) -> torch.Tensor:
        """``[rows, width]`` of per-sample 1-D tensors, zero-padded (zeros for filler rows)."""
        out = torch.zeros((len(micro.indices), width), dtype=torch.float32, device=self.device)
        for row, (i, w) in enumerate(zip(micro.indices, micro.weights, strict=True)):
            if w > 0:
                out[row, : per_sample[i].shape[0]] = per_sample[i]
        return out

    def counts(self, mb: int) -> tuple[float, float]:
        """Global (tokens, sequences) of mini-batch ``mb``."""
        indices = self.plan.mini_batches[mb]
        return float(sum(self.samples[i].num_loss_tokens for i in indices)), float(len(indices))

    def micro_batches(self, mb: int) -> list[MicroBatch]:
        return self.plan_micro(self.plan.rank_slices[mb], self.plan.mini_batches[mb].start)

    def rollout_logprobs(self, micro: MicroBatch, like: torch.Tensor) -> torch.Tensor:
        """The rollout engine's log-probs of a micro-batch, padded like ``like``."""
        rollout = torch.zeros_like(like)
        for r, i in enumerate(micro.indices):
            lps = self.samples[i].rollout_logprobs
            rollout[r, : len(lps)] = torch.tensor(lps, dtype=like.dtype)
        return rollout

    def actor_update(
        self,
        actor: nn.Module,
        optim: torch.optim.Optimizer,
        mb: int,
        cache: Cache,
        advantages: dict[int, torch.Tensor],
        scale: float,
        first_epoch: bool,
    ) -> None:
        """One actor optimizer step on mini-batch ``mb``."""
        cfg, m = self.config, self.metrics
        num_tokens, num_seqs = self.counts(mb)
        batch_tokens = float(sum(s.num_loss_tokens for s in self.samples))
        optim.zero_grad(set_to_none=True)
        for micro in self.micro_batches(mb):
            batch = self.batch(micro)
            width, mask = batch.response_mask.shape[1], batch.response_mask
            logp, entropy = self.logprobs(actor, batch, with_entropy=True)
            assert entropy is not None
            old = (
                self.stack(cache["old_logp"], micro, width)
                if "old_logp" in cache
                else logp.detach()
            )
            rollout = self.rollout_logprobs(micro, old)
            weights = importance_weights(
                old,
                rollout,
                cfg.loss.off_policy,
                cfg.loss.is_cap * (5.0 if cfg.loss.off_policy == "decoupled" else 1.0),
            )
            if weights is not None:
                m.add(
                    "actor/is_weight_mean",
                    agg_loss(weights, mask, "token-mean", num_tokens=num_tokens),
                    scale,
                )
            out = as_policy_loss_output(
                self.policy_loss(
                    PolicyLossInputs(
                        old_logprob=old,
                        logprob=logp,
                        advantages=self.stack(advantages, micro, width),
                        response_mask=mask,
                        num_tokens=num_tokens,
                        num_seqs=num_seqs,
                        token_weights=weights,
                    ),
                    PolicyLossOptions(
                        cfg.loss.clip_ratio_low,
                        cfg.loss.clip_ratio_high,
                        cfg.loss.clip_ratio_c,
                        cfg.loss.agg_mode,
                    ),
                )
            )
            ent = agg_loss(entropy, mask, cfg.loss.agg_mode, num_tokens, num_seqs)
            loss = out.loss - cfg.loss.entropy_coef * ent
            for name, value in (
                ("pg_loss", out.loss),
                ("entropy", ent),
                ("pg_clipfrac", out.pg_clipfrac),
                ("ppo_kl", out.ppo_kl),
                ("pg_clipfrac_lower", out.pg_clipfrac_lower),
            ):
                m.add(f"actor/{name}", value, scale)
            if "ref_logp" in cache and cfg.kl.mode == "loss":
                kl = kl_penalty(logp, self.stack(cache["ref_logp"], micro, width), cfg.kl.estimator)
                kl_loss = agg_loss(kl, mask, cfg.loss.agg_mode, num_tokens, num_seqs)
                loss = loss + cfg.kl.coef * kl_loss
                m.add("actor/kl_loss", kl_loss, scale)
                m.set_global("actor/kl_coef", cfg.kl.coef)
            if first_epoch:
                diff = (torch.exp(rollout) - torch.exp(old)).abs()
                m.add(
                    "training/rollout_probs_diff_mean",
                    agg_loss(diff, mask, "token-mean", num_tokens=batch_tokens),
                )
                m.max("training/rollout_probs_diff_max", masked_extrema(diff, mask)[0])
                # The same mismatch in log space, where a precision change shows first.
                logp_diff = (rollout - old).abs()
                m.add(
                    "training/rollout_logprob_diff_mean",
                    agg_loss(logp_diff, mask, "token-mean", num_tokens=batch_tokens),
                )
                m.max("training/rollout_logprob_diff_max", masked_extrema(logp_diff, mask)[0])
            (loss * self.world_size).backward()
        self._step(actor, optim, "actor", scale)

    def critic_update(
        self,
        critic: nn.Module,
        optim: torch.optim.Optimizer,
        mb: int,
        cache: Cache,
        returns: dict[int, torch.Tensor],
        scale: float,
    ) -> None:
        """One critic optimizer step on mini-batch ``mb``."""
        cfg, m = self.config, self.metrics
        num_tokens, num_seqs = self.counts(mb)
        optim.zero_grad(set_to_none=True)
        for micro in self.micro_batches(mb):
            batch = self.batch(micro)
            width, mask = batch.response_mask.shape[1], batch.response_mask
            vpreds = value_forward(critic, batch)
            out = compute_value_loss(
                vpreds,
                self.stack(cache["values"], micro, width),
                self.stack(returns, micro, width),
                mask,
                cfg.critic.value_clip,
                cfg.loss.agg_mode,
                num_tokens,
                num_seqs,
            )
            m.add("critic/vf_loss", out.loss, scale)
            m.add("critic/vf_clipfrac", out.vf_clipfrac, scale)
            m.add(
                "critic/vpred_mean",
                agg_loss(vpreds.detach(), mask, "token-mean", num_tokens),
                scale,
            )
            (out.loss * self.world_size).backward()
        self._step(critic, optim, "critic", scale)

    def _step(
        self, module: nn.Module, optim: torch.optim.Optimizer, role: str, scale: float
    ) -> None:
        """Clip, then step unless the gradient norm is not finite (counted, weights kept)."""
        grad_norm = float(clip_grad_norm(module.parameters(), self.config.optimizer.grad_clip))
        self.metrics.add_global(f"{role}/grad_norm", grad_norm, scale)
        if math.isfinite(grad_norm):
            optim.step()
            self.metrics.add_global(f"{role}/num_skipped_steps", 0.0)
        else:
            self.metrics.add_global(f"{role}/num_skipped_steps", 1.0)
        optim.zero_grad(set_to_none=True)


@torch.no_grad()
def precompute(
    ctx: UpdateContext,
    actor: nn.Module | None,
    reference: nn.Module | None,
    critic: nn.Module | None,
) -> Cache:
    """Per-sample old log-probs, reference log-probs and values (whichever are needed and
    held here: a critic rank passes no actor, an actor rank of a split learner no critic).

    With one optimizer step per batch the proximal policy is the current one, so its
    log-probs come from the update's own forward (``logp.detach()``): off-policy correction
    then costs no extra forward pass.
    """
    cfg = ctx.config
    need_old = actor is not None and (
        cfg.update.epochs * cfg.update.num_mini_batches > 1
        or (reference is not None and cfg.kl.mode == "reward")
    )
    cache: Cache = {}
    if not (need_old or reference is not None or critic is not None):
        return cache
    for micro in ctx.plan_micro(ctx.plan.owned_by_rank(), 0):
        batch = ctx.batch(micro)
        results: dict[str, torch.Tensor] = {}
        if need_old and actor is not None:
            results["old_logp"] = ctx.logprobs(actor, batch, False)[0]
        if reference is not None:
            # The reference routes by itself: replay follows the policy that sampled.
            own = replace(batch, routed_experts=None)
            results["ref_logp"] = ctx.logprobs(reference, own, False)[0]
        if critic is not None:
            results["values"] = value_forward(critic, batch)
        for key, tensor in results.items():
            per_sample = cache.setdefault(key, {})
            for row, (i, w) in enumerate(zip(micro.indices, micro.weights, strict=True)):
                if w > 0:
                    per_sample[i] = tensor[row, : len(ctx.samples[i].response_ids)].clone()
    return cache


def _loss_token_mask(
    samples: Sequence[TrainSample], lengths: torch.Tensor, width: int
) -> torch.Tensor:
    """``[batch, width]`` 1 on the response tokens the losses count: every token up to each
    response's length, less a multi-turn trajectory's observation tokens (holes)."""
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(-1)).float()
    for i, s in enumerate(samples):
        if s.loss_mask is not None:
            mask[i, : s.loss_mask.size] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return mask


def _token_rewards(
    samples: Sequence[TrainSample], scores: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Each sample's score on its last counted token; a multi-turn trajectory's per-turn
    rewards each on its own turn's last token instead (what its score adds to them, the
    overlong penalty, stays on the last one)."""
    token_rewards = last_token_scores(scores, mask)
    for i, s in enumerate(samples):
        if s.turn_rewards is not None:
            last = int(torch.nonzero(mask[i]).max())
            token_rewards[i, last] -= s.reward
            token_rewards[i, : s.turn_rewards.size] += torch.tensor(s.turn_rewards)
    return token_rewards


def compute_advantages(
    ctx: UpdateContext, cache: Cache, estimator: AdvantageEstimator
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Advantages and returns of this rank's samples from the estimator over the whole batch.

    Every rank holds every sample, so the estimator runs on the whole batch on each rank (the
    per-sample KL penalties and critic values, computed by the owning rank, are gathered over
    the whole world first: from the actor and critic ranks when they are split): any batch
    statistic it takes is the single-process one by construction.
    Scores get DAPO's overlong penalty here when ``overlong_buffer > 0`` (greedy baselines do
    not: their responses' lengths never reach the learner).
    """
    cfg, m, samples = ctx.config, ctx.metrics, ctx.samples
    lengths = torch.tensor([len(s.response_ids) for s in samples])
    width = int(lengths.max())
    mask = _loss_token_mask(samples, lengths, width)
    scores = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    if cfg.overlong.buffer > 0:
        penalty = overlong_penalty(
            lengths, cfg.max_new_tokens, cfg.overlong.buffer, cfg.overlong.penalty_factor
        )
        scores = scores + penalty
        m.set_global("actor/overlong_penalty/mean", float(penalty.mean()))
        m.set_global("actor/overlong_frac", float((penalty < 0).float().mean()))
    token_rewards = _token_rewards(samples, scores, mask)
    num_tokens = float(mask.sum())
    # Decided from the config, not the cache: ranks that hold no reference join the gather.
    if cfg.needs_reference and cfg.kl.mode == "reward":
        kl = _gather_rows(
            {
                i: kl_penalty(cache["old_logp"][i], cache["ref_logp"][i], cfg.kl.estimator)
                for i in ctx.plan.owned
                if "ref_logp" in cache
            },
            len(samples),
            width,
        )
        token_rewards = token_rewards - cfg.kl.coef * kl
        m.set_global("actor/reward_kl_penalty", float((kl * mask).sum() / num_tokens))
        m.set_global("actor/reward_kl_penalty_coeff", cfg.kl.coef)
    values = (
        _gather_rows(
            {i: cache["values"][i] for i in ctx.plan.owned if "values" in cache},
            len(samples),
            width,
        )
        if estimator.needs_critic
        else None
    )
    inputs = AdvantageInputs(
        token_rewards=token_rewards,
        response_mask=mask,
        group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long),
        values=values,
        baselines=_baselines(samples, estimator) if estimator.needs_baseline else None,
    )
    options = AdvantageOptions(
        gamma=cfg.advantage.gamma,
        lam=cfg.advantage.lam,
        norm_adv_by_std=cfg.advantage.norm_by_std,
        std_eps=cfg.advantage.norm_eps,
    )
    adv, returns = estimator.fn(inputs, options)
    for name, tensor in (("advantages", adv), ("returns", returns)):
        if not isinstance(tensor, torch.Tensor) or tensor.shape != mask.shape:
            raise ValueError(
                f"advantage estimator {estimator.name!r}: {name} must be a [batch, tokens] "
                f"tensor of shape {tuple(mask.shape)}, got "
                f"{getattr(tensor, 'shape', type(tensor).__name__)}"
            )
    adv, returns = adv.float() * mask, returns.float() * mask
    m.set_global("critic/rewards/mean", float((token_rewards * mask).sum() / len(samples)))
    stats = [("advantages", adv)]
    if values is not None:
        stats += [("returns", returns), ("values", values)]
    for name, tensor in stats:
        m.set_global(f"critic/{name}/mean", float((tensor * mask).sum() / num_tokens))
        hi, lo = masked_extrema(tensor, mask)
        m.set_global(f"critic/{name}/max", hi)
        m.set_global(f"critic/{name}/min", lo)
    return (
        {i: adv[i, : lengths[i]].to(ctx.device) for i in ctx.plan.owned},
        {i: returns[i, : lengths[i]].to(ctx.device) for i in ctx.plan.owned},
    )


def _baselines(samples: list[TrainSample], estimator: AdvantageEstimator) -> torch.Tensor:
    """``[B]`` greedy baseline scores; ValueError naming the estimator when one is missing."""
    missing = [i for i, s in enumerate(samples) if s.baseline is None]
    if missing:
        raise ValueError(
            f"advantage estimator {estimator.name!r} needs a greedy baseline score on every "
            f"sample; {len(missing)} of {len(samples)} have none (first: samples[{missing[0]}]); "
            "the coordinator sends them when the learner's GetInfo says needs_greedy_baseline"
        )
    return torch.tensor([s.baseline for s in samples], dtype=torch.float32)


def _gather_rows(mine: dict[int, torch.Tensor], num_rows: int, width: int) -> torch.Tensor:
    """``[num_rows, width]`` CPU float tensor of every rank's per-sample rows, zero-padded."""
    out = torch.zeros((num_rows, width), dtype=torch.float32)
    local = {i: t.detach().float().cpu() for i, t in mine.items()}
    for part in all_gather_objects(local):
        for i, row in part.items():
            out[i, : row.shape[0]] = row
    return out
