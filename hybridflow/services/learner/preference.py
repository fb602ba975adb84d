"""Learner-side preference steps: DPO, KTO, ORPO or SFT on the worker's actor, and held-out eval.

Each step reads what ``PolicyModels`` names and returns its metrics; the worker that calls it
(``LearnerWorker.preference_step``) counts the policy version.

One ``preference_step`` is one optimizer step of the worker's actor on a batch of records
(``PreferencePair`` for DPO and ORPO, ``LabelledCompletion`` for KTO and SFT), the same on every rank of
the SPMD group, laid out like the RL train step (``batching``): every rank receives the whole
batch and takes a contiguous slice; micro-batches accumulate gradients; each loss is divided by
the *global* example (DPO, KTO, ORPO's odds-ratio term) or token (SFT, ORPO's NLL term) count and scaled by the world size
before ``backward``, since FSDP2 averages gradients over ranks. The reference log-probs come
from the worker's frozen reference (``learner.kl.use_reference``, or ``algorithm: dpo``), the one
the RL KL term uses; ORPO and SFT use none. ``online_preference`` calls this step for the dpo / rft presets.

A DPO pair is two rows of one micro-batch (chosen rows, then rejected rows). KTO's reference
point z0 needs a pass over mismatched pairs first (prompt ``i`` with completion ``i - 1``,
TRL's construction), without gradients, summed over ranks. ORPO's NLL term covers, with
``orpo_nll_prompt`` (TRL's choice), the prompt tokens after the first as well: its chosen rows
are laid out as prompt ``p[:1]`` and response ``p[1:] + chosen`` (the same input ids, so the
same forward), and the odds-ratio term masks the ``len(p) - 1`` prompt slots out.

Knows nothing about gRPC, data files or tokenisers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hybridflow.algorithms.preference import (
    dpo_loss,
    kto_loss,
    orpo_loss,
    sequence_logprobs,
    sft_nll_sum,
)
from hybridflow.arrays import TokenArray
from hybridflow.data.preference import LabelledCompletion, PreferencePair
from hybridflow.services.learner.batch_plans import MicroBatch, StepPlan, plan_step_micro_batches
from hybridflow.services.learner.batching import PaddedBatch, build_batch, validate_sequences
from hybridflow.services.learner.distributed import all_reduce_sum
from hybridflow.services.learner.forward import policy_forward
from hybridflow.services.learner.fsdp import clip_grad_norm
from hybridflow.services.learner.metrics import StepMetrics
from hybridflow.services.learner.preference_config import PAIR_LOSSES, PreferenceConfig

if TYPE_CHECKING:
    from torch import nn

    from hybridflow.services.learner.config import LearnerConfig
    from hybridflow.services.learner.distributed import DistInfo


class PolicyModels(Protocol):
    """What a preference step reads of the learner (``LearnerWorker`` is one): the actor and
    its optimizer, the frozen reference, the config and where they live. A step writes only
    the actor's parameters and optimizer state; the policy version is the worker's to bump."""

    @property
    def actor(self) -> nn.Module: ...

    @property
    def actor_optim(self) -> torch.optim.Optimizer: ...

    @property
    def reference(self) -> nn.Module | None: ...

    @property
    def config(self) -> LearnerConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def dist(self) -> DistInfo: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...


LOGPROB_TEMPERATURE = 1.0
"""Preference losses score completions under the model's own distribution (no sampling)."""


def validate_records(records: Sequence[Any], loss: str, vocab_size: int) -> None:
    """Right record type for ``loss``, in-vocab non-empty sequences; ValueError naming the row."""
    want = PreferencePair if loss in PAIR_LOSSES else LabelledCompletion
    for i, r in enumerate(records):
        if not isinstance(r, want):
            raise ValueError(f"records[{i}]: {loss} needs {want.__name__}, got {type(r).__name__}")
    prompts, completions = _rows(records, range(len(records)))
    validate_sequences(prompts, completions, vocab_size)


def preference_step(
    worker: PolicyModels, records: Sequence[Any], cfg: PreferenceConfig
) -> dict[str, float]:
    """One actor optimizer step of ``cfg.loss`` on ``records`` (all ranks call); metrics."""
    cfg.validate()
    validate_records(records, cfg.loss, worker.vocab_size)
    if cfg.needs_reference and worker.reference is None:
        raise ValueError(f"preference loss {cfg.loss!r} needs learner.kl.use_reference: true")
    dist = worker.dist
    plan = StepPlan.build(len(records), 1, dist.world_size, dist.rank)
    micro_batches = _plan(worker, records, plan.rank_slices[0])
    metrics = StepMetrics(worker.device)
    num = float(len(records))
    num_tokens = float(sum(len(_completion(r)) for r in records))
    if cfg.loss == "orpo" and cfg.orpo_nll_prompt:
        num_tokens += float(sum(len(r.prompt_ids) - 1 for r in records))
    z0 = _kto_reference_point(worker, records, micro_batches) if cfg.loss == "kto" else None
    worker.actor_optim.zero_grad(set_to_none=True)
    for micro in micro_batches:
        weights = torch.tensor(micro.weights, dtype=torch.float32, device=worker.device)
        if cfg.loss == "orpo":
            loss = _orpo_micro(worker, cfg, records, micro, weights, num, num_tokens, metrics)
            metrics.add("train/loss", loss)
            (loss * dist.world_size).backward()
            continue
        batch = _batch(worker, records, micro)
        logp = _logp(worker, worker.actor, batch)
        if cfg.loss == "sft":
            loss = sft_nll_sum(logp, batch.response_mask) / num_tokens
            metrics.add("train/nll", loss)
        else:
            mean = cfg.loss == "dpo" and cfg.dpo_loss_type == "ipo"  # IPO: token means
            seq = sequence_logprobs(logp, batch.response_mask, mean)
            with torch.no_grad():
                ref = sequence_logprobs(_ref_logp(worker, batch), batch.response_mask, mean)
            if cfg.loss == "dpo":
                loss = _dpo_micro(cfg, seq, ref, weights, num, metrics)
            else:
                assert z0 is not None
                labels = [bool(records[i].label) for i in micro.indices]
                loss = _kto_micro(cfg, seq, ref, labels, weights, z0, num, metrics)
        metrics.add("train/loss", loss)
        (loss * dist.world_size).backward()
    grad_norm = float(clip_grad_norm(worker.actor.parameters(), worker.config.optimizer.grad_clip))
    if math.isfinite(grad_norm):
        worker.actor_optim.step()
    worker.actor_optim.zero_grad(set_to_none=True)
    out = metrics.reduce()
    out["actor/grad_norm"] = grad_norm
    out["actor/num_skipped_steps"] = 0.0 if math.isfinite(grad_norm) else 1.0
    if z0 is not None:
        out["kl"] = float(z0)
        for name in ("chosen", "rejected"):
            count = out[f"train/count/{name}"]
            out[f"train/rewards/{name}"] = out[f"train/rewards/{name}_sum"] / max(count, 1.0)
    return out


@torch.no_grad()
def preference_eval(
    worker: PolicyModels, pairs: Sequence[PreferencePair], beta: float
) -> dict[str, float]:
    """Held-out pair metrics (all ranks call): TRL's ``rewards/*`` with the implicit reward
    ``beta * (log pi - log pi_ref)``, the DPO loss, and the chosen responses' token-mean NLL.
    ``eval/mean_logps/accuracies`` needs no reference: the share of pairs whose chosen
    token-mean log-prob exceeds the rejected's (ORPO's own accuracy, TRL ORPOTrainer's
    ``rewards/accuracies``). Without a reference model only ``eval/nll``, ``eval/logps/*``
    and that accuracy are reported."""
    validate_records(pairs, "dpo", worker.vocab_size)
    dist = worker.dist
    plan = StepPlan.build(len(pairs), 1, dist.world_size, dist.rank)
    metrics = StepMetrics(worker.device)
    num = float(len(pairs))
    num_tokens = float(sum(len(p.chosen_ids) for p in pairs))
    for micro in _plan(worker, pairs, plan.rank_slices[0]):
        batch = _batch(worker, pairs, micro)
        logp = _logp(worker, worker.actor, batch)
        rows = len(micro.indices)
        metrics.add("eval/nll", sft_nll_sum(logp[:rows], batch.response_mask[:rows]) / num_tokens)
        seq = sequence_logprobs(logp, batch.response_mask)
        weights = torch.tensor(micro.weights, dtype=torch.float32, device=worker.device)
        metrics.add("eval/logps/chosen", (seq[:rows] * weights).sum() / num)
        metrics.add("eval/logps/rejected", (seq[rows:] * weights).sum() / num)
        mean = sequence_logprobs(logp, batch.response_mask, mean=True)
        wins = (mean[:rows] > mean[rows:]).float()
        metrics.add("eval/mean_logps/accuracies", (wins * weights).sum() / num)
        if worker.reference is not None:
            ref = sequence_logprobs(_ref_logp(worker, batch), batch.response_mask)
            out = dpo_loss(seq[:rows], seq[rows:], ref[:rows], ref[rows:], beta)
            _reward_metrics(
                metrics, "eval/", out.chosen_rewards, out.rejected_rewards, weights, num
            )
            metrics.add("eval/loss", (out.losses * weights).sum() / num)
    return metrics.reduce()


# ---------------------------------------------------------------- pieces
def _completion(record: Any) -> TokenArray:
    return record.completion_ids if isinstance(record, LabelledCompletion) else record.chosen_ids


def _rows(records: Sequence[Any], indices: Sequence[int]) -> tuple[list[Any], list[Any]]:
    """(prompts, completions) of the micro-batch rows: pairs give chosen rows, then rejected."""
    picked = [records[i] for i in indices]
    if picked and isinstance(picked[0], PreferencePair):
        prompts = [r.prompt_ids for r in picked] * 2
        return prompts, [r.chosen_ids for r in picked] + [r.rejected_ids for r in picked]
    return [r.prompt_ids for r in picked], [r.completion_ids for r in picked]


def _batch(worker: PolicyModels, records: Sequence[Any], micro: MicroBatch) -> PaddedBatch:
    prompts, completions = _rows(records, micro.indices)
    repeat = len(prompts) // len(micro.indices)
    return _build(
        worker, prompts, completions, worker.pad_id, worker.device, list(micro.weights) * repeat
    )


def _plan(
    worker: PolicyModels, records: Sequence[Any], rank_slices: Sequence[Sequence[int]]
) -> list[MicroBatch]:
    """This rank's micro-batches: ``micro_batch_size`` records, or by the token budget of
    ``learner.memory`` (a record's tokens: all of its rows')."""
    return plan_step_micro_batches(
        rank_slices,
        worker.dist.rank,
        worker.config.update.micro_batch_size,
        0,
        [_record_tokens(r) for r in records],
        worker.config.memory.max_tokens_per_micro_batch,
    )


def _record_tokens(record: Any) -> int:
    if isinstance(record, PreferencePair):
        return 2 * len(record.prompt_ids) + len(record.chosen_ids) + len(record.rejected_ids)
    return len(record.prompt_ids) + len(record.completion_ids)


def _build(
    worker: PolicyModels,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    pad_id: int,
    device: torch.device,
    weights: Sequence[float],
) -> PaddedBatch:
    """The rows' batch, packed with ``learner.memory.packing``."""
    return build_batch(
        prompts, completions, pad_id, device, weights, packed=worker.config.memory.packing
    )


def _logp(worker: PolicyModels, model: nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """Response log-probs under ``model`` (chunked with ``learner.memory.logprob_chunk_tokens``)."""
    chunk = worker.config.memory.head_chunk
    return policy_forward(model, batch, LOGPROB_TEMPERATURE, False, chunk)[0]


def _ref_logp(worker: PolicyModels, batch: PaddedBatch) -> torch.Tensor:
    assert worker.reference is not None
    return _logp(worker, worker.reference, batch)


def _reward_metrics(
    metrics: StepMetrics,
    prefix: str,
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    weights: torch.Tensor,
    num: float,
) -> None:
    metrics.add(f"{prefix}rewards/chosen", (chosen * weights).sum() / num)
    metrics.add(f"{prefix}rewards/rejected", (rejected * weights).sum() / num)
    metrics.add(f"{prefix}rewards/accuracies", ((chosen > rejected).float() * weights).sum() / num)
    metrics.add(f"{prefix}rewards/margins", ((chosen - rejected) * weights).sum() / num)


def _dpo_micro(
    cfg: PreferenceConfig,
    seq: torch.Tensor,
    ref: torch.Tensor,
    weights: torch.Tensor,
    num: float,
    metrics: StepMetrics,
) -> torch.Tensor:
    rows = weights.shape[0]
    out = dpo_loss(
        seq[:rows],
        seq[rows:],
        ref[:rows],
        ref[rows:],
        cfg.beta,
        cfg.label_smoothing,
        cfg.dpo_loss_type,
    )
    _reward_metrics(metrics, "train/", out.chosen_rewards, out.rejected_rewards, weights, num)
    return (out.losses * weights).sum() / num


def _kto_micro(
    cfg: PreferenceConfig,
    seq: torch.Tensor,
    ref: torch.Tensor,
    labels: list[bool],
    weights: torch.Tensor,
    z0: torch.Tensor,
    num: float,
    metrics: StepMetrics,
) -> torch.Tensor:
    desirable = torch.tensor(labels, dtype=torch.bool, device=seq.device)
    out = kto_loss(seq, ref, desirable, z0, cfg.beta, cfg.desirable_weight, cfg.undesirable_weight)
    live = weights > 0
    for name, mask in (("chosen", desirable & live), ("rejected", ~desirable & live)):
        metrics.add(f"train/rewards/{name}_sum", out.rewards[mask].sum())
        metrics.add(f"train/count/{name}", mask.sum().float())
    return (out.losses * weights).sum() / num


def _orpo_micro(
    worker: PolicyModels,
    cfg: PreferenceConfig,
    records: Sequence[Any],
    micro: MicroBatch,
    weights: torch.Tensor,
    num: float,
    num_tokens: float,
    metrics: StepMetrics,
) -> torch.Tensor:
    """NLL of the chosen tokens over the global token count plus ``lambda`` times the mean
    odds-ratio term; TRL's metric names (``log_odds_ratio`` is the mean log sigma(log OR),
    ``log_odds_chosen`` the mean log OR; rewards are ``lambda`` times token-mean log-probs)."""
    pairs = [records[i] for i in micro.indices]
    rows = len(pairs)
    # With orpo_nll_prompt a chosen row's "response" starts after its first prompt token.
    cut = [1 if cfg.orpo_nll_prompt else len(p.prompt_ids) for p in pairs]
    skip = [len(p.prompt_ids) - c for p, c in zip(pairs, cut)]  # prompt slots in the response
    prompts = [p.prompt_ids[:c] for p, c in zip(pairs, cut)] + [p.prompt_ids for p in pairs]
    completions = [[*p.prompt_ids[c:], *p.chosen_ids] for p, c in zip(pairs, cut)]
    completions += [p.rejected_ids for p in pairs]
    batch = _build(
        worker, prompts, completions, worker.pad_id, worker.device, list(micro.weights) * 2
    )
    logp = _logp(worker, worker.actor, batch)
    nll = sft_nll_sum(logp[:rows], batch.response_mask[:rows]) / num_tokens
    slots = torch.arange(batch.response_mask.shape[1], device=worker.device)
    offset = torch.tensor(skip + [0] * rows, device=worker.device)
    or_mask = batch.response_mask * (slots[None, :] >= offset[:, None])
    mean = sequence_logprobs(logp, or_mask, mean=True)
    out = orpo_loss(mean[:rows], mean[rows:])
    odds_term = (out.losses * weights).sum() / num
    metrics.add("train/nll", nll)
    metrics.add("train/log_odds_ratio", -odds_term)
    metrics.add("train/log_odds_chosen", (out.log_odds_ratio * weights).sum() / num)
    rewards = cfg.orpo_lambda * mean.detach()
    _reward_metrics(metrics, "train/", rewards[:rows], rewards[rows:], weights, num)
    return nll + cfg.orpo_lambda * odds_term


@torch.no_grad()
def _kto_reference_point(
    worker: PolicyModels, records: Sequence[Any], micro_batches: list[MicroBatch]
) -> torch.Tensor:
    """z0 = max(0, mean over the batch of log pi - log pi_ref on mismatched pairs)."""
    n = len(records)
    if n < 2:
        raise ValueError(
            "KTO needs >= 2 examples per step (its KL estimate pairs prompt i "
            "with completion i - 1)"
        )
    total = torch.zeros((), dtype=torch.float64, device=worker.device)
    for micro in micro_batches:
        prompts = [records[i].prompt_ids for i in micro.indices]
        completions = [records[(i - 1) % n].completion_ids for i in micro.indices]
        batch = _build(worker, prompts, completions, worker.pad_id, worker.device, micro.weights)
        pol = _logp(worker, worker.actor, batch)
        diff = sequence_logprobs(pol, batch.response_mask) - sequence_logprobs(
            _ref_logp(worker, batch), batch.response_mask
        )
        total = total + diff.double().sum()
    return (all_reduce_sum(total) / n).clamp(min=0.0).float()
