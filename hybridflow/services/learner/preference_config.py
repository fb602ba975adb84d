"""Preference-learning settings: the loss (DPO, KTO, ORPO, SFT), its coefficients, and the offline
job. They live beside the learner's preference step, which reads them (``hybridflow.preference``
re-exports them for the offline job).

The job's ``preference:`` section. With ``data`` set, ``deploy/launch.sh`` runs an offline,
learner-only job (no rollout, reward service or coordinator). Imports without torch or grpc;
``validate`` raises ValueError naming the field. Optimizer, micro-batching and devices stay in
``LearnerConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems

PreferenceLoss = Literal["dpo", "kto", "orpo", "sft"]
"""The loss of an offline preference (or SFT) job."""
PREFERENCE_LOSSES: tuple[str, ...] = get_args(PreferenceLoss)
PAIR_LOSSES: tuple[str, ...] = ("dpo", "orpo")
"""Losses trained on preference pairs (``prompt``, ``chosen``, ``rejected``)."""
DPOLossType = Literal["sigmoid", "hinge", "ipo"]
"""DPO's loss on the margin (``hybridflow.algorithms.preference.dpo_loss``)."""
DPO_LOSS_TYPES: tuple[str, ...] = get_args(DPOLossType)


@dataclass
class PreferenceConfig:
    """The preference (or SFT) loss of a learner-side offline step."""

    loss: PreferenceLoss = "dpo"
    """dpo (pairs), kto (labelled completions), orpo (pairs, no reference) or sft (token-mean
    NLL of responses)."""
    beta: float = knob(0.1, gt=0)
    """Strength of the implicit KL to the reference (DPO and KTO; TRL's default 0.1)."""
    label_smoothing: float = knob(0.0, ge=0, lt=0.5)
    """DPO: assumed probability that a pair's labels are flipped (conservative DPO), [0, 0.5)."""
    dpo_loss_type: DPOLossType = "sigmoid"
    """DPO's loss on the margin h: sigmoid (the paper's), hinge (SLiC) or ipo (squared
    distance to 1/(2 beta), on token-mean log-probs); TRL's loss_type."""
    orpo_lambda: float = knob(0.1, ge=0)
    """ORPO: weight of the odds-ratio term against the NLL term (the paper's lambda, TRL's
    ORPOConfig.beta; default 0.1 as TRL's), >= 0."""
    orpo_nll_prompt: bool = False
    """ORPO: true adds the prompt tokens after the first to the NLL term, as TRL's ORPOTrainer
    does; false (default): the chosen response tokens only, like loss sft (docs/trl-parity.md)."""
    desirable_weight: float = knob(1.0, ge=0)
    """KTO: weight of the desirable examples' losses."""
    undesirable_weight: float = knob(1.0, ge=0)
    """KTO: weight of the undesirable examples' losses."""
    data: str = knob("", free="a dataset name or path, checked when it loads")
    """Train data: builtin:arith_dpo / _kto / _sft or a .jsonl / .parquet file in TRL's format
    for ``loss`` (orpo reads dpo's pairs); set, it makes deploy/launch.sh run this offline job instead of RL."""
    eval_data: str = knob("", free="a dataset path, checked when it loads")
    """Held-out DPO pairs (empty: a built-in train set's own test pairs; a file: no eval)."""
    steps: int = knob(100, ge=0)
    """Optimizer steps of the offline job."""
    batch_size: int = knob(16, ge=1)
    """Examples (DPO: pairs) per optimizer step."""
    eval_every: int = knob(0, ge=0)
    """Evaluate every this many steps (0: only before and after training)."""
    num_rows: int | None = knob(None, ge=1)
    """Read at most this many train rows (null: all; a built-in set then generates 512)."""

    def validate(self) -> None:
        """Raise ValueError naming every bad field: each field's bound, plus label smoothing
        only with the sigmoid DPO loss."""
        raise_problems(
            [
                *field_problems(self, "preference"),
                "preference.label_smoothing applies to dpo_loss_type sigmoid only, "
                f"not {self.dpo_loss_type}"
                if self.label_smoothing and self.dpo_loss_type != "sigmoid"
                else None,
            ]
        )

    @property
    def needs_reference(self) -> bool:
        """DPO and KTO compare with the frozen reference; ORPO and SFT do not."""
        return self.loss in ("dpo", "kto")

    @property
    def record_kind(self) -> str:
        """The data format the loss reads (``hybridflow.data.preference`` kind): dpo for the
        pair losses, else the loss's own."""
        return "dpo" if self.loss in PAIR_LOSSES else self.loss
