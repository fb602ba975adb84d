"""The staleness bound of the async schedule, in its two units, fixed once at the job's start.

A *version* is one optimizer step of the learner (``policy_version`` counts them); a *step* is
one train step of the schedule, a batch of ``prompts_per_step`` groups. A train step is
``versions_per_step`` versions (``ppo_epochs * num_mini_batches`` for the PPO family, 1 for
dpo and rft), which the learner states in its info before the first step.

``coordinator.max_staleness`` is in versions: no sample trains more than that many versions
behind the learner. Admission and the pacer count in steps: generation may run
``max_steps`` steps ahead of the published weights. Both come from this one object, which
``GroupBuffer`` owns; nothing rewrites it during a run. No threads, no clients.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StalenessBound:
    """How far a sample may lag the learner: ``max_versions`` (the config key) and, through
    ``versions_per_step``, the same bound in whole steps (``max_steps``)."""

    max_versions: int
    """Versions a sample may lag the learner when it is trained (``coordinator.max_staleness``)."""
    versions_per_step: int = 1
    """Learner versions per train step (from the learner's info)."""

    def __post_init__(self) -> None:
        if self.max_versions < 0 or self.versions_per_step < 1:
            raise ValueError(
                f"staleness bound: max_versions >= 0 and versions_per_step >= 1, got "
                f"{self.max_versions} and {self.versions_per_step}"
            )

    @property
    def max_steps(self) -> int:
        """Whole train steps generation may run ahead of the published weights: a group
        started under the weights of step p is trained by step p + max_steps + 1 and then lags
        at most ``max_steps * versions_per_step <= max_versions`` versions."""
        return self.max_versions // self.versions_per_step

    def too_stale(self, sample_version: int, learner_version: int) -> bool:
        """True when a sample generated under ``sample_version`` may no longer train."""
        return learner_version - sample_version > self.max_versions

    def check_sync_every(self, sync_every: int) -> None:
        """ValueError when publishing every ``sync_every`` steps lets samples lag past the
        bound: a sample generated right after a publish trains up to ``sync_every - 1`` steps
        later."""
        lag = (sync_every - 1) * self.versions_per_step
        if lag > self.max_versions:
            raise ValueError(
                f"coordinator.sync_every={sync_every} lets samples lag {lag} versions "
                f"({self.versions_per_step} per step), over max_staleness={self.max_versions}"
            )
