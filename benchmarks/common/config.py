"""Benchmark suite configuration (strict YAML via hybridflow's loader; no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

NO_EVALUATION = "coordinator.eval.sets=[]"
"""The override that turns a job's held-out evaluation off (the shipped quickstart evaluates)."""


def without_evaluation(tree: Path) -> list[str]:
    """The overrides that keep ``tree``'s jobs from evaluating while a benchmark times them:
    ``NO_EVALUATION`` where the tree has ``coordinator.eval``, nothing in a tree from before
    it (which neither evaluates nor knows the key), so two commits time the same work."""
    knows = (tree / "hybridflow" / "coordinator" / "eval_config.py").is_file()
    return [NO_EVALUATION] if knows else []


@dataclass
class Variant:
    """One side of a side-by-side comparison: a name and its job overrides."""

    name: str
    """Label in summary.json, logs and plots."""
    overrides: list[str] = field(default_factory=list)
    """Dotted job-config overrides (as with deploy/launch.sh --set)."""


@dataclass
class BenchmarkConfig:
    """A suite: the same job run once per variant, in one invocation."""

    suite: str = "throughput"
    """Suite name (throughput, scalability, algorithm, integration)."""
    job: str = "deploy/configs/quickstart.yaml"
    """Job YAML every variant starts from (model, sequence lengths, resources, workload)."""
    overrides: list[str] = field(default_factory=list)
    """Overrides applied to every variant (e.g. coordinator.num_steps=40)."""
    variants: list[Variant] = field(default_factory=list)
    """Runs to compare side by side."""
    repeats: int = 1
    """Times each variant runs (alternating); figures are medians over the repeats."""
    warmup_steps: int = 3
    """Steps excluded from the rate figures."""
    profile: bool = True
    """Record a py-spy flame graph of every process (profile.svg) in an extra, shorter run of
    the first variant (the timed runs stay unprofiled)."""
    profile_steps: int = 20
    """Steps of the profiled run."""
    plots: bool = True
    """Write PNG plots."""
    timeout_s: float = 900.0
    """Limit per variant."""
    evaluate: bool = False
    """Keep the job's held-out evaluation (``coordinator.eval``, as the eval_cost suite
    does); False: every launch turns it off (``without_evaluation``), so the timed steps
    hold the training's work alone."""

    def validate(self) -> None:
        if not self.variants:
            raise ValueError("variants: at least one variant is required")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variants: names must be unique, got {names}")
        if self.repeats < 1:
            raise ValueError("repeats must be >= 1")
        if self.warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
