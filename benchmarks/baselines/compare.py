"""Stored benchmark figures and the regression check against them (standard library only).

A baseline file (e.g. cpu-2core.json) holds, per variant of one suite, the speed figures and
the peak memory per service of reference runs, with tolerances: a speed figure more than
``tolerances.speed`` below the baseline, or a memory figure more than its own tolerance above
it, is a regression. Faster or leaner beyond tolerance is reported, never a failure.

A baseline is tied to the environment it was measured in: the hash of the lock file the
packages came from and the hardware. A run from another environment is not compared at all
(``not_comparable`` says why), since a moved dependency shifts memory and speed without any
change of ours. Memory tolerances come from the spread of the stored runs: every repeat of
every summary given to ``--update`` is kept, and a figure's tolerance is
``MEMORY_SPREAD_FACTOR`` times its relative range, at least ``MIN_MEMORY_TOLERANCE``.

    python benchmarks/baselines/compare.py results/<run>/summary.json            # check
    python benchmarks/baselines/compare.py --update results/<a>/summary.json results/<b>/...

Exit code 1 when a regression is found, 3 when the run cannot be compared with the baseline.
Knows summary.json's layout, nothing else.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_BASELINE = Path(__file__).resolve().parent / "cpu-2core.json"
SPEED_KEYS = (
    "e2e_samples_per_s",
    "generation_tokens_per_s",
    "training_steps_per_s",
    "training_samples_per_s",
)
"""Higher is better; checked against ``tolerances.speed``."""


MEMORY_SPREAD_FACTOR = 3.0
"""A memory figure may rise this many times its relative range over the stored repeats."""
MIN_MEMORY_TOLERANCE = 0.03
"""Floor of a memory tolerance (fraction): allocator noise between identical runs."""
HARDWARE_KEYS = ("cpu", "cpus", "machine", "gpu")
"""Hardware fields that must match for figures to be comparable."""


@dataclass(frozen=True)
class Finding:
    """One figure outside its tolerance (or missing)."""

    variant: str
    kind: str
    """"speed", "memory" or "missing"."""
    key: str
    baseline: float
    current: float
    regression: bool
    """True: worse than tolerated. False: better than the band (consider --update)."""

    def __str__(self) -> str:
        if self.kind == "missing":
            return f"{self.variant}: {self.key} missing from the run"
        change = self.current / self.baseline - 1.0 if self.baseline else float("inf")
        label = "REGRESSION" if self.regression else "improved"
        return (
            f"{label} {self.variant} {self.kind} {self.key}: {self.current:.4g} vs baseline "
            f"{self.baseline:.4g} ({change:+.1%})"
        )


def not_comparable(summary: dict[str, Any], baseline: dict[str, Any]) -> str | None:
    """Why the run cannot be held against the baseline (another environment), or None."""
    base_lock = baseline.get("environment", {}).get("lock_sha256")
    run_lock = summary.get("environment", {}).get("lock_sha256")
    if not base_lock:
        return "the baseline records no lock hash: refresh it with --update on this environment"
    if run_lock != base_lock:
        return (
            f"packages differ: the run's lock {str(run_lock)[:12]} vs the baseline's "
            f"{base_lock[:12]} (store a baseline for this lock with --update)"
        )
    run_hw, base_hw = summary.get("hardware", {}), baseline.get("hardware", {})
    for key in HARDWARE_KEYS:
        if run_hw.get(key) != base_hw.get(key):
            return f"hardware differs: {key} {run_hw.get(key)!r} vs baseline {base_hw.get(key)!r}"
    return None


def memory_tolerance(repeats: list[float]) -> float:
    """Tolerance of one memory figure from its stored repeats."""
    if len(repeats) < 2 or min(repeats) <= 0:
        return max(MIN_MEMORY_TOLERANCE, 0.10)  # no spread known: the old fixed band
    spread = (max(repeats) - min(repeats)) / statistics.median(repeats)
    return max(MIN_MEMORY_TOLERANCE, MEMORY_SPREAD_FACTOR * spread)


def figures_of(summary: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per variant: {"speed": {...}, "memory": {service: peak RSS bytes}} from summary.json."""
    out = {}
    for name, fig in summary["variants"].items():
        out[name] = {
            "speed": {k: float(fig[k]) for k in SPEED_KEYS if k in fig},
            "memory": {k: float(v) for k, v in (fig.get("peak_rss_bytes") or {}).items()},
        }
    return out


def compare(summary: dict[str, Any], baseline: dict[str, Any]) -> list[Finding]:
    """Every figure of the baseline checked against the run's summary."""
    speed_tol = float(baseline["tolerances"]["speed"])
    memory_tols = baseline.get("memory_tolerances", {})
    current = figures_of(summary)
    findings = []
    for variant, base in baseline["figures"].items():
        if variant not in current:
            findings.append(Finding(variant, "missing", "variant", 0.0, 0.0, True))
            continue
        cur = current[variant]
        for key, ref in base.get("speed", {}).items():
            if key not in cur["speed"]:
                findings.append(Finding(variant, "missing", key, ref, 0.0, True))
            elif cur["speed"][key] < ref * (1.0 - speed_tol):
                findings.append(Finding(variant, "speed", key, ref, cur["speed"][key], True))
            elif cur["speed"][key] > ref * (1.0 + speed_tol):
                findings.append(Finding(variant, "speed", key, ref, cur["speed"][key], False))
        for key, ref in base.get("memory", {}).items():
            memory_tol = float(memory_tols.get(variant, {}).get(key, 0.10))
            if key not in cur["memory"]:
                findings.append(
                    Finding(variant, "missing", f"peak_rss_bytes.{key}", ref, 0.0, True)
                )
            elif cur["memory"][key] > ref * (1.0 + memory_tol):
                findings.append(Finding(variant, "memory", key, ref, cur["memory"][key], True))
            elif cur["memory"][key] < ref * (1.0 - memory_tol):
                findings.append(Finding(variant, "memory", key, ref, cur["memory"][key], False))
    return findings


def updated(
    baseline: dict[str, Any], summaries: list[dict[str, Any]], sources: list[str]
) -> dict[str, Any]:
    """The baseline rebuilt from one or more runs of one environment (speed tolerance kept).

    Figures are medians over every repeat of every run; memory tolerances are sized from the
    same repeats."""
    first = summaries[0]
    for other, source in zip(summaries[1:], sources[1:]):
        reason = not_comparable(other, {**first, "environment": first.get("environment", {})})
        if reason:
            raise ValueError(f"{source} is from another environment than {sources[0]}: {reason}")
    per_run = [figures_of(s) for s in summaries]
    figures: dict[str, dict[str, dict[str, float]]] = {}
    memory_tolerances: dict[str, dict[str, float]] = {}
    for variant in per_run[0]:
        speed_runs = [r[variant]["speed"] for r in per_run if variant in r]
        memory_runs = [m for s in summaries for m in _memory_repeats(s, variant)]
        figures[variant] = {
            "speed": {k: statistics.median(r[k] for r in speed_runs) for k in speed_runs[0]},
            "memory": {k: statistics.median(m[k] for m in memory_runs) for k in memory_runs[0]},
        }
        memory_tolerances[variant] = {
            k: round(memory_tolerance([m[k] for m in memory_runs]), 4) for k in memory_runs[0]
        }
    return {
        **baseline,
        "suite": first["suite"],
        "hardware": first.get("hardware", {}),
        "environment": first.get("environment", {}),
        "source": {
            "summaries": sources,
            "date": first.get("date"),
            "git_commit": first.get("git_commit"),
            "versions": first.get("versions", {}),
        },
        "figures": figures,
        "memory_tolerances": memory_tolerances,
    }


def _memory_repeats(summary: dict[str, Any], variant: str) -> list[dict[str, float]]:
    """Peak RSS per service for each repeat of ``variant`` (older summaries: the one figure)."""
    fig = summary["variants"].get(variant)
    if fig is None:
        return []
    repeats = fig.get("repeats_peak_rss_bytes")
    if repeats:
        return [{k: float(v) for k, v in r.items()} for r in repeats]
    return [{k: float(v) for k, v in (fig.get("peak_rss_bytes") or {}).items()}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("summary", type=Path, nargs="+", help="suite runs' summary.json")
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
    parser.add_argument(
        "--update", action="store_true", help="store the runs (one environment) as the baseline"
    )
    args = parser.parse_args(argv)
    summaries = [json.loads(p.read_text()) for p in args.summary]
    baseline = json.loads(args.baseline.read_text())
    for path, summary in zip(args.summary, summaries):
        if summary["suite"] != baseline["suite"]:
            parser.error(f"{path} is suite {summary['suite']!r}, baseline {baseline['suite']!r}")
    if args.update:
        try:
            new = updated(baseline, summaries, [str(p) for p in args.summary])
        except ValueError as exc:
            parser.error(str(exc))
        args.baseline.write_text(json.dumps(new, indent=2) + "\n")
        print(f"stored {len(summaries)} run(s) as {args.baseline}")
        return 0
    if len(summaries) != 1:
        parser.error("check one summary at a time (several only with --update)")
    if not baseline["figures"]:
        print(f"{args.baseline} has no figures yet: store a run with --update", file=sys.stderr)
        return 2
    reason = not_comparable(summaries[0], baseline)
    if reason:
        print(f"not comparable with {args.baseline.name}: {reason}", file=sys.stderr)
        return 3
    findings = compare(summaries[0], baseline)
    for f in findings:
        print(f)
    regressions = [f for f in findings if f.regression]
    print(f"{len(regressions)} regression(s) beyond tolerance")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
