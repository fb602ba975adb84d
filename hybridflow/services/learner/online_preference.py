"""The train step of the preference presets: online DPO and RFT on an RL batch.

``learner.algorithm: dpo`` turns the batch into one ``PreferencePair`` per group (best vs worst
reward, ``hybridflow.algorithms.online_preference``) and ``rft`` keeps the samples scoring
``>= learner.rft.threshold`` as SFT examples; either then takes one optimizer step through
``preference_step`` (the offline DPO / SFT machinery: same losses, micro-batching and FSDP2
normalisation). A batch that yields nothing to train on takes no optimizer step, yet the
policy version still rises by one: the coordinator counts one version per train step.

Metrics use verl's ``actor/`` names; ``actor/pg_loss`` repeats the step's loss so that
dashboards and ``RLTrainer``'s ``policy_loss`` show it. An empty step reports zero loss
(the empty sum: no gradient). Knows nothing about gRPC or the coordinator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.algorithms.online_preference import best_worst_pairs, rft_kept
from hybridflow.data.preference import LabelledCompletion, PreferencePair
from hybridflow.services.learner.preference import preference_step
from hybridflow.services.learner.preference_config import PreferenceConfig
from hybridflow.types import TrainSample

if TYPE_CHECKING:
    from hybridflow.services.learner.preference import PolicyModels

_DPO_METRICS: dict[str, tuple[str, ...]] = {
    "train/loss": ("actor/dpo_loss", "actor/pg_loss"),
    "train/rewards/accuracies": ("actor/pref_accuracy",),
    "train/rewards/margins": ("actor/reward_margin",),
    "train/rewards/chosen": ("actor/chosen_reward",),
    "train/rewards/rejected": ("actor/rejected_reward",),
}
"""preference_step's DPO metric names → this step's (verl-style) names."""

_RFT_METRICS: dict[str, tuple[str, ...]] = {"train/nll": ("actor/sft_nll", "actor/pg_loss")}
"""preference_step's SFT metric names → this step's names."""

_STEP_METRICS = ("actor/grad_norm", "actor/num_skipped_steps")
"""preference_step metrics passed through unchanged."""


def online_dpo_step(worker: PolicyModels, samples: list[TrainSample]) -> dict[str, float]:
    """One DPO step on each group's best-vs-worst pair (all ranks call); metrics."""
    selection = best_worst_pairs([s.reward for s in samples], [s.group_id for s in samples])
    pairs = [
        PreferencePair(
            prompt_ids=samples[chosen].prompt_ids,
            chosen_ids=samples[chosen].response_ids,
            rejected_ids=samples[rejected].response_ids,
            index=chosen,
        )
        for chosen, rejected in selection.pairs
    ]
    cfg = PreferenceConfig(
        loss="dpo", beta=worker.config.dpo.beta, dpo_loss_type=worker.config.dpo.loss_type
    )
    out = _step(worker, pairs, cfg, _DPO_METRICS)
    out["actor/num_pairs"] = float(len(pairs))
    out["actor/num_tied_groups"] = float(selection.num_tied_groups)
    return out


def rft_step(worker: PolicyModels, samples: list[TrainSample]) -> dict[str, float]:
    """One SFT step on the samples with reward >= ``learner.rft.threshold`` (all ranks call)."""
    kept = rft_kept([s.reward for s in samples], worker.config.rft.threshold)
    examples = [
        LabelledCompletion(
            prompt_ids=samples[i].prompt_ids, completion_ids=samples[i].response_ids, index=i
        )
        for i in kept
    ]
    out = _step(worker, examples, PreferenceConfig(loss="sft"), _RFT_METRICS)
    out["actor/rft_kept"] = float(len(kept))
    out["actor/rft_kept_frac"] = len(kept) / len(samples)
    return out


def _step(
    worker: PolicyModels,
    records: list[PreferencePair] | list[LabelledCompletion],
    cfg: PreferenceConfig,
    names: dict[str, tuple[str, ...]],
) -> dict[str, float]:
    """``preference_step`` on ``records`` with its metrics renamed; no step when empty."""
    if not records:
        return {name: 0.0 for targets in names.values() for name in targets} | {
            name: 0.0 for name in _STEP_METRICS
        }
    metrics = preference_step(worker, records, cfg)
    out = {name: metrics[source] for source, targets in names.items() for name in targets}
    return out | {name: metrics[name] for name in _STEP_METRICS}
