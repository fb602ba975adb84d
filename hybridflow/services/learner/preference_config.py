"""Preference-learning settings: the loss (DPO, KTO, ORPO, SFT), its coefficients, and the offline
job. They live beside the learner's preference step, which reads them (``hybridflow.preference``
re-exports them for the offline job).

The job's ``preference:`` section. With ``data`` set, ``deploy/launch.sh`` runs an offline,
learner-only job (no rollout, reward service or coordinator). Imports without torch or grpc;
``validate`` raises ValueError naming the field. Optimizer, micro-batching and devices stay in
``LearnerConfig``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

PREFERENCE_LOSSES: tuple[str, ...] = ("dpo", "kto", "orpo", "sft")
PAIR_LOSSES: tuple[str, ...] = ("dpo", "orpo")
"""Losses trained on preference pairs (``prompt``, ``chosen``, ``rejected``)."""
DPOLossType = Literal["sigmoid", "hinge", "ipo"]
"""DPO's loss on the margin (``hybridflow.algorithms.preference.dpo_loss``)."""
DPO_LOSS_TYPES: tuple[str, ...] = get_args(DPOLossType)


@dataclass
class PreferenceConfig:
    """The preference (or SFT) loss of a learner-side offline step."""

    loss: Literal["dpo", "kto", "orpo", "sft"] = "dpo"
    """dpo (pairs), kto (labelled completions), orpo (pairs, no reference) or sft (token-mean
    NLL of responses)."""
    beta: float = 0.1
    """Strength of the implicit KL to the reference (DPO and KTO; TRL's default 0.1)."""
    label_smoothing: float = 0.0
    """DPO: assumed probability that a pair's labels are flipped (conservative DPO), [0, 0.5)."""
    dpo_loss_type: DPOLossType = "sigmoid"
    """DPO's loss on the margin h: sigmoid (the paper's), hinge (SLiC) or ipo (squared
    distance to 1/(2 beta), on token-mean log-probs); TRL's loss_type."""
    orpo_lambda: float = 0.1
    """ORPO: weight of the odds-ratio term against the NLL term (the paper's lambda, TRL's
    ORPOConfig.beta; default 0.1 as TRL's), >= 0."""
    orpo_nll_prompt: bool = False
    """ORPO: true adds the prompt tokens after the first to the NLL term, as TRL's ORPOTrainer
    does; false (default): the chosen response tokens only, like loss sft (docs/trl-parity.md)."""
    desirable_weight: float = 1.0
    """KTO: weight of the desirable examples' losses."""
    undesirable_weight: float = 1.0
    """KTO: weight of the undesirable examples' losses."""
    data: str = ""
    """Train data: builtin:arith_dpo / _kto / _sft or a .jsonl / .parquet file in TRL's format
    for ``loss`` (orpo reads dpo's pairs); set, it makes deploy/launch.sh run this offline job instead of RL."""
    eval_data: str = ""
    """Held-out DPO pairs (empty: a built-in train set's own test pairs; a file: no eval)."""
    steps: int = 100
    """Optimizer steps of the offline job."""
    batch_size: int = 16
    """Examples (DPO: pairs) per optimizer step."""
    eval_every: int = 0
    """Evaluate every this many steps (0: only before and after training)."""
    num_rows: int | None = None
    """Read at most this many train rows (null: all; a built-in set then generates 512)."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.loss not in PREFERENCE_LOSSES:
            raise ValueError(
                f"preference.loss must be one of {PREFERENCE_LOSSES}, got {self.loss!r}"
            )
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"preference.beta must be a finite number > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(
                f"preference.label_smoothing must be in [0, 0.5), got {self.label_smoothing}"
            )
        if self.dpo_loss_type not in DPO_LOSS_TYPES:
            raise ValueError(
                f"preference.dpo_loss_type must be one of {DPO_LOSS_TYPES}, "
                f"got {self.dpo_loss_type!r}"
            )
        if self.label_smoothing and self.dpo_loss_type != "sigmoid":
            raise ValueError(
                "preference.label_smoothing applies to dpo_loss_type sigmoid only, "
                f"not {self.dpo_loss_type}"
            )
        for name in ("orpo_lambda", "desirable_weight", "undesirable_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"preference.{name} must be a finite number >= 0, got {value}")
        for name, low in (("steps", 0), ("batch_size", 1), ("eval_every", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"preference.{name} must be >= {low}, got {getattr(self, name)}")
        if self.num_rows is not None and self.num_rows < 1:
            raise ValueError(f"preference.num_rows must be >= 1 or null, got {self.num_rows}")

    @property
    def needs_reference(self) -> bool:
        """DPO and KTO compare with the frozen reference; ORPO and SFT do not."""
        return self.loss in ("dpo", "kto")

    @property
    def record_kind(self) -> str:
        """The data format the loss reads (``hybridflow.data.preference`` kind): dpo for the
        pair losses, else the loss's own."""
        return "dpo" if self.loss in PAIR_LOSSES else self.loss
