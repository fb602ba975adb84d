"""The verdict of a side-by-side comparison: per variant and figure, HEAD's repeats against
BASE's, measured in one run on one machine (standard library only; no stored numbers).

A figure's *speed-up* is the ratio of the two medians, oriented so that above 1 is better
(HEAD/BASE for rates, BASE/HEAD for seconds and bytes). Its *noise* is what the run itself
measured: the larger relative range, (max - min) / median, of the two sides' repeats. The
band a ratio must leave to count is ``max(MIN_BAND, noise)``:

- ``regression``: speed-up below ``1 - band`` (HEAD is worse by more than the noise);
- ``inconclusive``: no regression seen, but the band is wider than ``MAX_BAND`` (the run was
  too noisy to rule out a real slowdown of that size: rerun on a quiet machine);
- ``faster``: speed-up above ``1 + band``;
- ``same``: inside the band.

Knows figure names and lists of numbers, nothing of how they were measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

HIGHER, LOWER = 1, -1
FIGURES = {
    "e2e_samples_per_s": HIGHER,
    "mean_learner_compute_s": LOWER,
    "mean_gen_s_per_step": LOWER,
}
"""Speed figures compared, with their better direction: the job's throughput, and the two
phases that bound it (a slower learner or generator shows in its own figure even where the
async schedule hides it from the throughput)."""
MEMORY_PREFIX = "peak_rss_bytes/"
"""Peak RSS per service (``peak_rss_bytes/<service>``), lower is better."""
MIN_BAND = 0.05
"""Smallest change that counts, however quiet the run (allocator and timer jitter)."""
MAX_BAND = 0.25
"""Noisier than this, the run cannot rule out a regression it would have to catch."""


@dataclass(frozen=True)
class FigureVerdict:
    """One figure of one variant: BASE's and HEAD's repeats and what they say."""

    variant: str
    figure: str
    base: tuple[float, ...]
    head: tuple[float, ...]

    @property
    def direction(self) -> int:
        return LOWER if self.figure.startswith(MEMORY_PREFIX) else FIGURES[self.figure]

    @property
    def speedup(self) -> float:
        """Above 1: HEAD is better (ratio of medians, oriented)."""
        base, head = statistics.median(self.base), statistics.median(self.head)
        return head / base if self.direction == HIGHER else base / head

    @property
    def noise(self) -> float:
        return max(relative_range(self.base), relative_range(self.head))

    @property
    def band(self) -> float:
        return max(MIN_BAND, self.noise)

    @property
    def status(self) -> str:
        if self.speedup < 1.0 - self.band:
            return "regression"
        if self.band > MAX_BAND:
            return "inconclusive"
        return "faster" if self.speedup > 1.0 + self.band else "same"

    def line(self) -> str:
        return (
            f"{self.variant:<20} {self.figure:<28} base {statistics.median(self.base):10.4g}  "
            f"head {statistics.median(self.head):10.4g}  speed-up {self.speedup:6.3f}  "
            f"noise {self.noise:6.1%}  {self.status}"
        )


def relative_range(values: tuple[float, ...]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else 0.0


def figures_compared(run: dict[str, object]) -> dict[str, float]:
    """The compared figures of one run's figures (``benchmarks.common.figures``), flat."""
    out = {name: float(run[name]) for name in FIGURES if name in run}  # type: ignore[arg-type]
    rss = run.get("peak_rss_bytes") or {}
    assert isinstance(rss, dict)
    out.update({f"{MEMORY_PREFIX}{service}": float(v) for service, v in rss.items()})
    return out


def compare(
    base: dict[str, list[dict[str, float]]], head: dict[str, list[dict[str, float]]]
) -> list[FigureVerdict]:
    """Per variant (``{variant: [figures of each repeat]}`` per side), a verdict per figure
    both sides measured (a figure that is 0 on either side was not measured there)."""
    verdicts = []
    for variant, base_runs in base.items():
        head_runs = head[variant]
        for figure in base_runs[0]:
            b = tuple(r[figure] for r in base_runs if figure in r)
            h = tuple(r[figure] for r in head_runs if figure in r)
            if len(b) == len(base_runs) and len(h) == len(head_runs) and min(b + h) > 0:
                verdicts.append(FigureVerdict(variant, figure, b, h))
    return verdicts


def exit_code(verdicts: list[FigureVerdict]) -> int:
    """1 on any regression, else 3 when a figure was inconclusive, else 0."""
    statuses = {v.status for v in verdicts}
    if "regression" in statuses:
        return 1
    return 3 if "inconclusive" in statuses else 0
