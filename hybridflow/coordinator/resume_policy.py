"""What a resume may change: every config key classified, and the comparison of the
checkpoint's resolved config with the resuming job's.

Three kinds of key (docs/resume.md lists them with the reasons):
- ``APPLY``: takes effect on resume as it would at a fresh start, because it lives in a
  process that starts anew (every service re-reads its config) or in a counter the schedule
  re-derives (``num_steps``: the admission cap; ``update.epochs`` / ``num_mini_batches``: the
  versions per step, which the restarted learner states in its info). The optimizer's hyperparameters
  are re-applied after its state is loaded (``services/learner/optim_hparams.py``).
- ``REBASE``: changes what "exactly once" counts in, and is re-derived so the audit stays
  exact: ``prompts_per_step`` (the admission count is rebased to the new batch size;
  ``rebased_num_started``).
- ``REFUSE``: cannot be honoured by a resume (another dataset or prompt order, another
  model or algorithm, a restored RNG that would hide the change): the resume stops with one
  line naming each such key, its old and its new value.

A key with no rule is refused ("not classified"), so a new key cannot slip through
unexamined; tests/unit/coordinator/test_resume_policy.py fails until it is classified.

Pure: plain dicts in (``dataclasses.asdict`` of two ``JobConfig``), a decision out; a
checkpoint's flat learner keys of before the sections (``learner.lr``) are compared under
their new names. Knows nothing of files, services or which process reads a key.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Policy(enum.Enum):
    """What a resume does with a changed key: apply it, rebase the schedule on it, or refuse."""

    APPLY = "apply"
    REBASE = "rebase"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Rule:
    """A key's resume policy and the reason for it."""

    policy: Policy
    why: str
    """One clause: why the key is what it is (the refusal message and docs/resume.md)."""
    routine: bool = False
    """Changed by every launch (addresses, the checkpoint path): accepted without a log line."""


def _apply(why: str) -> Rule:
    return Rule(Policy.APPLY, why)


def _refuse(why: str) -> Rule:
    return Rule(Policy.REFUSE, why)


_PROCESS = _apply("a process setting, read when the service starts")
_ADDRESS = Rule(Policy.APPLY, "an address the launcher assigns at each launch", routine=True)
_SCHEDULE = _apply("read by the schedule at each step; nothing pending survives a resume")
_LOSS = _apply("read by the learner at each step")
_OPTIM = _apply("re-applied to the optimizer after its state is restored")
_EVAL = _apply(
    "read by the evaluator at each evaluation; the records of earlier ones stay as they were"
)
_DATA = "the dataset's rows and their indices would differ from the checkpoint's cursor"

_LORA = _refuse(
    "the adapters' rank, scale and layers are part of the trained weights the checkpoint holds"
)

RULES: dict[str, Rule] = {
    "model": _refuse("the checkpoint's weights belong to the model it was taken with"),
    # ---------------------------------------------------------------- coordinator
    "coordinator.data": _refuse(_DATA),
    "coordinator.data_size": _refuse(_DATA),
    "coordinator.max_prompt_tokens": _refuse(_DATA + " (other prompts dropped as too long)"),
    "coordinator.max_prompt_bytes": _apply(
        "a row over it is an error, never dropped: a dataset that loads is the same dataset"
    ),
    "coordinator.seed": _refuse(
        "it orders the prompts of every epoch: a new order mid-epoch trains some prompts "
        "twice and others never"
    ),
    "coordinator.num_steps": _apply("the admission cap is re-derived from it"),
    "coordinator.prompts_per_step": Rule(
        Policy.REBASE, "the admission count is rebased to the new batch size"
    ),
    "coordinator.group_size": _apply(
        "every prompt pending at the checkpoint is generated again, with the new group size"
    ),
    "coordinator.sampling.temperature": _SCHEDULE,
    "coordinator.sampling.top_p": _SCHEDULE,
    "coordinator.sampling.top_k": _SCHEDULE,
    "coordinator.sampling.max_new_tokens": _SCHEDULE,
    "coordinator.prompts_per_request": _SCHEDULE,
    "coordinator.sync_every": _SCHEDULE,
    "coordinator.max_staleness": _apply(
        "admission is rebuilt from it and every batch is checked against it"
    ),
    "coordinator.admission": _SCHEDULE,
    "coordinator.overlap_publish": _SCHEDULE,
    "coordinator.train_ahead": _SCHEDULE,
    "coordinator.overlap_scoring": _SCHEDULE,
    "coordinator.dynamic_sampling": _SCHEDULE,
    "coordinator.dynamic_sampling_max_rounds": _SCHEDULE,
    "coordinator.multi_turn.env": _refuse(
        "the run's rewards and trajectories belong to the environment it was trained with"
    ),
    "coordinator.multi_turn.agent": _refuse(
        "the run's rewards and trajectories belong to the agent it was trained with"
    ),
    "coordinator.multi_turn.max_turns": _SCHEDULE,
    "coordinator.multi_turn.max_total_tokens": _SCHEDULE,
    "coordinator.multi_turn.env_concurrency": _SCHEDULE,
    "coordinator.rollout_addresses": _ADDRESS,
    "coordinator.reward_address": _ADDRESS,
    "coordinator.environment_address": _ADDRESS,
    "coordinator.learner_address": _ADDRESS,
    "coordinator.eval.sets": _EVAL,
    "coordinator.eval.every": _EVAL,
    "coordinator.eval.before_training": _EVAL,
    "coordinator.eval.at_end": _EVAL,
    "coordinator.eval.k": _EVAL,
    "coordinator.eval.sampling.temperature": _EVAL,
    "coordinator.eval.sampling.top_p": _EVAL,
    "coordinator.eval.sampling.top_k": _EVAL,
    "coordinator.eval.sampling.max_new_tokens": _EVAL,
    "coordinator.eval.pass_threshold": _EVAL,
    "coordinator.eval.prompts_per_request": _EVAL,
    "coordinator.eval.timeout_s": _EVAL,
    "coordinator.channel.*": _PROCESS,
    "coordinator.server.*": _PROCESS,
    "coordinator.save_checkpoint": _SCHEDULE,
    "coordinator.checkpoint_every": _SCHEDULE,
    "coordinator.keep_checkpoints": _SCHEDULE,
    "coordinator.replica_rejoin_timeout_s": _PROCESS,
    "coordinator.replica_stall_timeout_s": _PROCESS,
    "coordinator.service_wait_s": _PROCESS,
    "coordinator.progress": _PROCESS,
    "coordinator.loggers": _PROCESS,
    # ---------------------------------------------------------------- learner
    "learner.algorithm": _refuse("the train state holds the modules of its algorithm"),
    "learner.advantage_estimator": _refuse(
        "the estimator decides whether a critic (and its optimizer) is in the train state"
    ),
    "learner.policy_loss": _refuse("another objective is another algorithm; start a new run"),
    "learner.dpo.loss_type": _refuse("another objective is another algorithm; start a new run"),
    "learner.seed": _refuse(
        "it seeds torch's generator, whose state the checkpoint restores: the change would "
        "have no effect"
    ),
    "learner.moe_router_replay": _LOSS,
    "learner.temperature": _LOSS,  # derived: coordinator.sampling.temperature
    "learner.max_new_tokens": _LOSS,  # derived: coordinator.sampling.max_new_tokens
    "learner.peak_tflops": _PROCESS,
    "learner.optimizer.lr": _OPTIM,
    "learner.optimizer.weight_decay": _OPTIM,
    "learner.optimizer.betas": _OPTIM,
    "learner.optimizer.grad_clip": _LOSS,
    "learner.update.micro_batch_size": _LOSS,
    "learner.update.epochs": _apply("the restarted learner's info gives the versions per step"),
    "learner.update.num_mini_batches": _apply(
        "the restarted learner's info gives the versions per step"
    ),
    "learner.loss.clip_ratio_low": _LOSS,
    "learner.loss.clip_ratio_high": _LOSS,
    "learner.loss.clip_ratio_c": _LOSS,
    "learner.loss.agg_mode": _LOSS,
    "learner.loss.entropy_coef": _LOSS,
    "learner.loss.off_policy": _LOSS,
    "learner.loss.is_cap": _LOSS,
    "learner.advantage.norm_by_std": _LOSS,
    "learner.advantage.norm_eps": _LOSS,
    "learner.advantage.gamma": _LOSS,
    "learner.advantage.lam": _LOSS,
    "learner.kl.coef": _LOSS,
    "learner.kl.estimator": _LOSS,
    "learner.kl.mode": _LOSS,
    "learner.kl.use_reference": _apply(
        "the reference is the initial model, reloaded at start, never checkpointed"
    ),
    "learner.critic.lr": _OPTIM,
    "learner.critic.value_clip": _LOSS,
    "learner.overlong.buffer": _LOSS,
    "learner.overlong.penalty_factor": _LOSS,
    "learner.dpo.beta": _LOSS,
    "learner.rft.threshold": _LOSS,
    "learner.topology.num_threads": _PROCESS,
    "learner.topology.device": _PROCESS,
    "learner.topology.nproc_per_node": _apply("the train state is resharded on load (DCP)"),
    "learner.topology.critic_nproc_per_node": _apply(
        "the train state is resharded on load (DCP), split critic or co-located"
    ),
    "learner.topology.devices": _PROCESS,
    "learner.topology.critic_devices": _PROCESS,
    "learner.topology.nnodes": _apply("the train state is resharded on load (DCP)"),
    "learner.topology.node_rank": _PROCESS,
    "learner.topology.rdzv_endpoint": _ADDRESS,
    "learner.topology.local_addr": _ADDRESS,
    "learner.server.*": _PROCESS,
    "learner.memory.dtype": _apply(
        "master weights and optimizer state stay float32, as saved; compute precision is a setting"
    ),
    "learner.memory.activation_checkpointing": _apply(
        "a memory tool: how a step is held, not what it computes"
    ),
    "learner.memory.packing": _apply("a memory tool: how a step is held, not what it computes"),
    "learner.memory.shared_prompts": _apply(
        "a memory tool: how a step is held, not what it computes"
    ),
    "learner.memory.max_tokens_per_micro_batch": _apply(
        "a memory tool: the losses add up to the same batch loss"
    ),
    "learner.memory.logprob_chunk_tokens": _apply(
        "a memory tool: how a step is held, not what it computes"
    ),
    "learner.memory.full_logits": _apply(
        "which positions' logits are computed, not the log-probs read from them"
    ),
    "learner.memory.cpu_offload": _apply(
        "a memory tool: where state lives between uses, not what it is"
    ),
    "learner.lora.rank": _LORA,
    "learner.lora.alpha": _LORA,
    "learner.lora.dropout": _LORA,
    "learner.lora.target_modules": _LORA,
    "learner.checkpoint_dir": Rule(
        Policy.APPLY, "a path; the launcher sets it under the run directory", routine=True
    ),
    # ---------------------------------------------------------------- stateless sections
    "rollout.*": _apply(
        "rollout replicas hold no train state; they get the restored weights before they generate"
    ),
    "reward.*": _apply("the reward service holds no train state"),
    "environment.*": _apply(
        "the environment service holds no train state; episodes in flight start again"
    ),
    "weight_sync.*": _PROCESS,
    "deploy.*": _apply("launcher settings"),
    "preference.*": _refuse("an offline preference job is another kind of job"),
    "tinker.enabled": _refuse("a Tinker-compatible service job is another kind of job"),
    "tinker.*": _apply(
        "a setting of the Tinker-compatible service, read when it starts; its models and "
        "their steps live in its own state folder"
    ),
}
"""Exact dotted keys, or ``section.*`` for every key under a section."""

UNCLASSIFIED = _refuse("the key is not classified for resume (resume_policy.RULES)")


def rule_for(key: str) -> Rule:
    """The key's rule: its own, else the nearest ``prefix.*`` one, else ``UNCLASSIFIED``."""
    if key in RULES:
        return RULES[key]
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        rule = RULES.get(".".join(parts[:end]) + ".*")
        if rule is not None:
            return rule
    return UNCLASSIFIED


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; values normalised as JSON (tuples are lists)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.loads(json.dumps(value))
    return out


@dataclass(frozen=True)
class Change:
    """One key whose value differs between the checkpoint's config and the resume's, with
    its rule."""

    key: str
    old: Any
    new: Any
    rule: Rule

    def describe(self) -> str:
        return f"{self.key} {self.old!r} -> {self.new!r}"


@dataclass(frozen=True)
class ResumeDecision:
    """Every changed key of a resume, split into refused and accepted."""

    changes: tuple[Change, ...]
    """Every key whose value differs (keys present in both configs only)."""

    @property
    def refused(self) -> list[Change]:
        return [c for c in self.changes if c.rule.policy is Policy.REFUSE]

    @property
    def accepted(self) -> list[Change]:
        return [c for c in self.changes if c.rule.policy is not Policy.REFUSE]

    def refusal(self) -> str | None:
        """One line naming each refused key, its old and new value and why; None: none."""
        if not self.refused:
            return None
        what = "; ".join(f"{c.describe()}: {c.rule.why}" for c in self.refused)
        return (
            f"resume refused: {what} (resume without that change, or start a new run "
            "from the checkpoint's weights)"
        )

    def changed(self, key: str) -> Change | None:
        return next((c for c in self.changes if c.key == key), None)


def compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> ResumeDecision:
    """The checkpoint's resolved config (``old``) against the resuming job's (``new``). A key
    only one side has (a config written by another version) is not a change."""
    before, after = _current_keys(flatten(old)), _current_keys(flatten(new))
    changes = tuple(
        Change(key, before[key], after[key], rule_for(key))
        for key in sorted(before.keys() & after.keys())
        if before[key] != after[key]
    )
    return ResumeDecision(changes)


def _current_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` with a section's renamed keys under their new names (a checkpoint written
    before ``learner`` was nested has ``learner.lr``, compared as ``learner.optimizer.lr``)."""
    from hybridflow.services.learner.config import LearnerConfig

    renamed = {
        f"learner.{old}": f"learner.{new}" for old, new in LearnerConfig.RENAMED_KEYS.items()
    }
    return {renamed.get(key, key): value for key, value in flat.items()}


def rebased_num_started(
    num_started: int, step: int, old_prompts_per_step: int, new_prompts_per_step: int
) -> int:
    """Admission's started-groups count in units of the new batch size. Admission allows
    ``(published_step + lead + 1) * prompts_per_step`` groups; a checkpoint of step ``s``
    has ``s * old`` of them behind it (plus any difference dynamic sampling left), so with
    the new batch size the same point of the schedule is ``s * new`` plus that difference.
    Without the rebase a smaller batch makes capacity negative: nothing starts, ever."""
    return max(0, num_started + step * (new_prompts_per_step - old_prompts_per_step))
