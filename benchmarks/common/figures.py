"""Figures of one finished run directory (metrics.jsonl, events.jsonl, summary.json,
service_usage.json). Pure file reading and arithmetic."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def is_step_row(row: dict[str, Any]) -> bool:
    """Whether a metrics.jsonl line is a training step's (an evaluation's line holds only
    ``eval/...`` keys beside ``step`` and ``time``)."""
    return not any(key.startswith("eval/") for key in row)


def read_steps(path: Path) -> list[dict[str, Any]]:
    """A metrics.jsonl's training steps (an evaluation's lines left out)."""
    return [row for row in read_jsonl(path) if is_step_row(row)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def run_figures(run_dir: Path, warmup_steps: int) -> dict[str, Any]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    metrics = [row for row in rows if is_step_row(row)]
    events = read_jsonl(run_dir / "events.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    usage_path = run_dir / "service_usage.json"
    usage = json.loads(usage_path.read_text()) if usage_path.exists() else {}
    timed = metrics[warmup_steps:] or metrics
    t_first = timed[0]["time"] - timed[0]["timing_s/step"]
    wall = timed[-1]["time"] - t_first
    gens = [e for e in events if e["kind"] == "generate" and e["start"] >= t_first]
    syncs = sum(m.get("timing_s/update_weights", 0.0) for m in timed)
    transfer = sum(
        max(
            0.0,
            m["timing_s/update_actor"]
            - m.get("timing_s/learner_compute", m["timing_s/update_actor"]),
        )
        for m in timed
    )
    samples = sum(m["batch/num_samples"] for m in timed)
    gen_busy = sum(e["duration_s"] for e in gens)
    return {
        "steps_timed": len(timed),
        "wall_s": wall,
        "generation_tokens_per_s": sum(e["num_tokens"] for e in gens) / wall if wall else 0.0,
        "generation_tokens_per_busy_s": sum(e["num_tokens"] for e in gens) / gen_busy
        if gen_busy
        else 0.0,
        "training_steps_per_s": len(timed) / wall if wall else 0.0,
        "training_samples_per_s": samples / sum(m["timing_s/update_actor"] for m in timed),
        "e2e_samples_per_s": samples / wall if wall else 0.0,
        "weight_sync_share": syncs / wall if wall else 0.0,
        "batch_transfer_share": transfer / wall if wall else 0.0,
        "communication_overhead_share": (syncs + transfer) / wall if wall else 0.0,
        "rollout_idle_ratio": summary["rollout_idle_ratio"],
        "learner_idle_ratio": summary["learner_idle_ratio"],
        "mean_gen_s_per_step": mean([m["timing_s/gen"] for m in timed]),
        "mean_train_s_per_step": mean(
            [m["timing_s/update_actor"] + m.get("timing_s/update_weights", 0.0) for m in timed]
        ),
        "mean_sync_s": mean([m.get("timing_s/update_weights", 0.0) for m in timed]),
        "mean_step_s": mean([m["timing_s/step"] for m in timed]),
        # Reward calls' seconds per step (all replicas; beside generation when
        # coordinator.overlap_scoring is on).
        "mean_score_s_per_step": mean([m.get("timing_s/score", 0.0) for m in timed]),
        "mean_learner_compute_s": mean([m.get("timing_s/learner_compute", 0.0) for m in timed]),
        # Per-step medians: one launch's typical step, whatever a few stalled steps did.
        "median_gen_s_per_step": median([m["timing_s/gen"] for m in timed]),
        "median_learner_compute_s": median([m.get("timing_s/learner_compute", 0.0) for m in timed]),
        # A publish's whole wall time, from the end of its train step until every replica
        # holds it (beside the next step when coordinator.overlap_publish is on).
        "mean_publish_wall_s": mean(
            [e["duration_s"] for e in events if e["kind"] == "sync" and e["start"] >= t_first]
        ),
        "peak_rss_bytes": {k: int(v["peak_rss_bytes"]) for k, v in usage.items()},
        "peak_gpu_bytes": {
            k: int(v["peak_gpu_bytes"]) for k, v in usage.items() if "peak_gpu_bytes" in v
        },
        "cpu_s": {
            **{k: v["cpu_s"] for k, v in usage.items()},
            "coordinator": summary.get("coordinator_cpu_s", 0.0),
        },
        # Held-out evaluations inside the timed steps (coordinator.eval), and how long the
        # weight publishes waited for them.
        "eval_s": sum(
            v
            for row in rows
            if not is_step_row(row) and row.get("time", 0.0) >= t_first
            for k, v in row.items()
            if k.startswith("eval/") and k.endswith("/seconds") and v is not None
        ),
        "eval_hold_wait_s": sum(
            e["duration_s"] for e in events if e["kind"] == "eval_hold" and e["start"] >= t_first
        ),
        "reward_start": summary["reward_start"],
        "reward_end": summary["reward_end"],
        "staleness_histogram": summary["staleness_histogram"],
        "dropped_stale": summary["num_dropped_stale"],
    }
