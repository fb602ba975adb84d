"""What a training run records: summary.json (``RunSummary``), trained.jsonl lines (the
audit), per-step timing figures, and the state one ``TrainingJob.run`` carries between steps.

Plain data and arithmetic; the schedule itself is ``job.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from hybridflow.coordinator.dataflow import ScoredGroup
from hybridflow.coordinator.metrics import MetricsLog, Progress
from hybridflow.types import TrainSample


@dataclass
class RunSummary:
    """What ``summary.json`` holds at the end of a run."""

    num_steps: int
    reward_start: float
    """Mean reward of the first batch (samples from the initial policy)."""
    reward_end: float
    """Mean reward of the last min(20, steps) batches."""
    wall_s: float
    samples_per_s: float
    policy_version: int
    num_requeued: int
    num_dropped_stale: int
    num_untrained_at_end: int
    """Groups generated (or re-queued) but not trained when the run ended."""
    staleness_histogram: dict[str, int]
    rollout_idle_ratio: float
    learner_idle_ratio: float
    checkpoint: str
    """The final policy as a Hugging Face checkpoint ("" when not saved)."""
    resumed_from_step: int = 0
    """Step of the checkpoint this run continued from (0: a fresh start)."""
    last_checkpoint: str = ""
    """Newest resumable checkpoint directory."""
    time_to_first_step_s: float | None = None
    """Seconds from the launch (``TrainingJob.launch_time``) to the end of this run's first
    trained step; None when no step was trained."""
    num_filtered: int = 0
    """Groups not trained by dynamic sampling (all rewards equal); their prompts are consumed."""
    mfu: float | None = None
    """The learner's model FLOPs utilisation, mean of its steps' ``perf/mfu`` in this run;
    None when it reported none (see ``mfu_note``)."""
    tokens_per_s_per_device: float | None = None
    """Mean of the learner's ``perf/tokens_per_s_per_device`` over this run's steps."""
    mfu_note: str = ""
    """Why ``mfu`` is None ("" when it is not)."""
    coordinator_cpu_s: float | None = None
    """CPU seconds (user + system) of the process that ran the schedule, up to the summary
    (the benchmarks' coordinator cost); None when unknown."""


@dataclass
class RunState:
    """What one ``run`` carries from step to step: its logs and clocks."""

    first_step: int
    metrics_log: MetricsLog
    audit: TextIO
    progress: Progress
    start: float
    """perf_counter at the start of this run."""
    wall_before: float
    """Training wall time of the runs before a resume."""
    wall_end: float = 0.0
    gen_s_seen: float = 0.0
    """Generation seconds already reported (``timing_s/gen`` is per step)."""
    score_s_seen: float = 0.0
    """Scoring seconds already reported (``timing_s/score`` is per step)."""
    next_version: int = 0
    """The policy version the next step sent to the learner starts from (``open`` sets it;
    ahead of the state's version while a step is in flight)."""
    landed_at: float = 0.0
    """perf_counter when the last step was handled: a step sent ahead counts its time from
    there, not from when it was sent."""
    first_step_s: float | None = None
    checkpoint: str = ""
    last_checkpoint: str = ""
    utilisation: dict[str, list[float]] = field(
        default_factory=lambda: {"perf/mfu": [], "perf/tokens_per_s_per_device": []}
    )
    """The learner's per-step utilisation metrics (this run's steps), for the summary."""


MFU_UNKNOWN = (
    "the learner reported no perf/mfu: its device's peak FLOPs is unknown (set "
    "learner.peak_tflops) or its algorithm (dpo, rft) has no FLOPs estimate"
)


def mean_finite(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def num_generated(groups: Sequence[ScoredGroup]) -> int:
    """Completions generated for these groups: their samples plus a greedy baseline each
    (ReMax). With dynamic sampling, filtered groups count too: the cost of a step."""
    return sum(len(g.completions) + (g.baseline is not None) for g in groups)


def step_timings(
    train_batch: Sequence[TrainSample], t0: float, t1: float, t2: float, t3: float, gen_s: float
) -> dict[str, float]:
    """Where a step's time went (t0 wait → t1 train → t2 publish+pace → t3) and throughput."""
    num_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in train_batch)
    return {
        "timing_s/gen": gen_s,
        "timing_s/wait_batch": t1 - t0,
        "timing_s/update_actor": t2 - t1,
        "timing_s/update_weights": t3 - t2,
        "timing_s/step": t3 - t0,
        "perf/throughput": num_tokens / (t3 - t0),
        "perf/samples_per_s": len(train_batch) / (t3 - t0),
    }


def write_audit(
    audit: TextIO,
    step: int,
    batch: Sequence[ScoredGroup],
    version: int,
    filtered: bool = False,
) -> None:
    """One line per consumed group: what the kill harness counts (once per epoch). Groups
    dynamic sampling filtered are consumed without training: ``"filtered": true``."""
    for g in batch:
        p = g.prompt
        line = {
            "step": step,
            "epoch": getattr(p, "epoch", 0),
            "index": p.index,
            "seq": getattr(p, "seq", -1),
            "generated_version": min(c.policy_version for c in g.completions),
            "version": version,
        }
        if filtered:
            line["filtered"] = True
        audit.write(json.dumps(line) + "\n")
    audit.flush()
