"""Stored benchmark figures and the regression check against them (standard library only).

A baseline file (e.g. cpu-2core.json) holds, per variant of one suite, the speed figures and
the peak memory per service of a reference run, with tolerances: a speed figure more than
``tolerances.speed`` below the baseline, or a memory figure more than ``tolerances.memory``
above it, is a regression. Faster or leaner beyond tolerance is reported, never a failure.

    python benchmarks/baselines/compare.py results/<run>/summary.json            # check
    python benchmarks/baselines/compare.py results/<run>/summary.json --update   # store

Exit code 1 when a regression is found. Knows summary.json's layout, nothing else.
"""

from __future__ import annotations

import argparse
import json
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
    tol = baseline["tolerances"]
    speed_tol, memory_tol = float(tol["speed"]), float(tol["memory"])
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
            if key not in cur["memory"]:
                findings.append(
                    Finding(variant, "missing", f"peak_rss_bytes.{key}", ref, 0.0, True)
                )
            elif cur["memory"][key] > ref * (1.0 + memory_tol):
                findings.append(Finding(variant, "memory", key, ref, cur["memory"][key], True))
            elif cur["memory"][key] < ref * (1.0 - memory_tol):
                findings.append(Finding(variant, "memory", key, ref, cur["memory"][key], False))
    return findings


def updated(baseline: dict[str, Any], summary: dict[str, Any], source: str) -> dict[str, Any]:
    """The baseline with its figures replaced by the run's (tolerances kept)."""
    return {
        **baseline,
        "suite": summary["suite"],
        "hardware": summary.get("hardware", {}),
        "source": {
            "summary": source,
            "date": summary.get("date"),
            "git_commit": summary.get("git_commit"),
            "versions": summary.get("versions", {}),
        },
        "figures": figures_of(summary),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("summary", type=Path, help="a suite run's summary.json")
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
    parser.add_argument("--update", action="store_true", help="store the run as the baseline")
    args = parser.parse_args(argv)
    summary = json.loads(args.summary.read_text())
    baseline = json.loads(args.baseline.read_text())
    if summary["suite"] != baseline["suite"]:
        parser.error(f"summary is suite {summary['suite']!r}, baseline {baseline['suite']!r}")
    if args.update:
        args.baseline.write_text(
            json.dumps(updated(baseline, summary, str(args.summary)), indent=2) + "\n"
        )
        print(f"stored {args.summary} as {args.baseline}")
        return 0
    if not baseline["figures"]:
        print(f"{args.baseline} has no figures yet: store a run with --update", file=sys.stderr)
        return 2
    findings = compare(summary, baseline)
    for f in findings:
        print(f)
    regressions = [f for f in findings if f.regression]
    print(f"{len(regressions)} regression(s) beyond tolerance {baseline['tolerances']}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
