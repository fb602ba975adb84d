"""Preference-learning settings: which loss (DPO, KTO, SFT) and its coefficients.

Imports without torch or grpc. ``validate`` raises ValueError naming the field. The optimizer,
micro-batching and devices stay in ``LearnerConfig``; this holds only what the preference
losses add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

PREFERENCE_LOSSES: tuple[str, ...] = ("dpo", "kto", "sft")


@dataclass
class PreferenceConfig:
    """The preference (or SFT) loss of a learner-side offline step."""

    loss: Literal["dpo", "kto", "sft"] = "dpo"
    """dpo (pairs), kto (labelled completions) or sft (token-mean NLL of responses)."""
    beta: float = 0.1
    """Strength of the implicit KL to the reference (DPO and KTO; TRL's default 0.1)."""
    label_smoothing: float = 0.0
    """DPO: assumed probability that a pair's labels are flipped (conservative DPO), [0, 0.5)."""
    desirable_weight: float = 1.0
    """KTO: weight of the desirable examples' losses."""
    undesirable_weight: float = 1.0
    """KTO: weight of the undesirable examples' losses."""

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
        for name in ("desirable_weight", "undesirable_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"preference.{name} must be a finite number >= 0, got {value}")

    @property
    def needs_reference(self) -> bool:
        """DPO and KTO compare with the frozen reference; SFT does not."""
        return self.loss != "sft"
