"""``learner.lora``: low-rank adapters on the actor (imports without torch or grpc)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of the decoder families in the registry."""


@dataclass
class LoraConfig:
    """Low-rank adapters on the actor's linear layers; rank 0: off (full fine-tuning)."""

    rank: int = knob(0, ge=0, le=1024)
    """r of every adapter: ``W + (alpha / r) * B @ A`` with A ``[r, in]``, B ``[out, r]``;
    0 trains the whole model instead."""
    alpha: float = knob(16.0, gt=0)
    """Scale numerator: the adapter's update is multiplied by ``alpha / rank``."""
    dropout: float = knob(0.0, ge=0, lt=1)
    """Must be 0: the learner's log-probs must be the rollout's (the importance ratio of an
    on-policy sample is 1), and dropout on the adapter's input would make them differ."""
    target_modules: list[str] = knob(
        default_factory=lambda: list(DEFAULT_TARGETS),
        free="module names, matched against the model's linear layers when it loads",
    )
    """Last names of the linear layers that get adapters (``q_proj``, ``down_proj``...)."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def validate(self) -> None:
        raise_problems(
            [
                *field_problems(self, "learner.lora"),
                None
                if self.dropout == 0
                else (
                    f"learner.lora.dropout must be 0, got {self.dropout:g}: the learner's "
                    "log-probs must equal the rollout's, and dropout would make them differ"
                ),
                None
                if self.target_modules or not self.enabled
                else "learner.lora.target_modules: list at least one module name",
                None
                if all(m and "." not in m for m in self.target_modules)
                else (
                    "learner.lora.target_modules: last names of linear layers (q_proj), "
                    f"got {self.target_modules}"
                ),
            ]
        )
