"""The verdict of a side-by-side comparison: per variant and figure, HEAD's repeats against
BASE's, measured in one run on one machine (standard library only; no stored numbers).

A figure's *speed-up* is the ratio of the two sides' geometric means, oriented so that above
1 is better (HEAD/BASE for rates, BASE/HEAD for seconds and bytes). Its *noise* is what the
run itself measured: one launch's spread around its side's mean, the standard deviation of
the logarithms pooled over both sides (on these shared 2-core machines a launch's figure moves
by ~10 % from one launch to the next with the same code, with where its processes and memory
land). The log speed-up then wanders by ``standard_error`` = noise * sqrt(1/n_base +
1/n_head), and the *band* it must leave to count is ``max(MIN_BAND, t * standard_error)``, t
the one-sided 99 % quantile of Student's t for the run's degrees of freedom (a one-sided t
test on the logs; a false alarm about once in a hundred figures of identical code):

- ``regression``: speed-up below ``exp(-band)`` (HEAD is worse by more than the noise);
- ``inconclusive``: no regression seen, but a slowdown of 25 % (``MAX_BAND``) would still sit
  inside the band (too noisy to rule out what it must catch: more repeats, a quieter machine);
- ``faster``: speed-up above ``exp(band)``;
- ``same``: inside the band.

Knows figure names and lists of numbers, nothing of how they were measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

HIGHER, LOWER = 1, -1
FIGURES = {
    "e2e_samples_per_s": HIGHER,
    "median_learner_compute_s": LOWER,
    "median_gen_s_per_step": LOWER,
}
"""Speed figures compared, with their better direction: the job's throughput, and the two
phases that bound it (a slower learner or generator shows in its own figure even where the
async schedule hides it from the throughput). The phases are per-step medians, so that one
stalled step (a page fault storm, a neighbour's burst) does not move a launch's figure."""
MEMORY_PREFIX = "peak_rss_bytes/"
"""Peak RSS per service (``peak_rss_bytes/<service>``), lower is better."""
MIN_BAND = math.log(1 / 0.95)
"""Smallest change that counts (5 %), however quiet the run (allocator and timer jitter)."""
MAX_BAND = math.log(1 / 0.75)
"""A run whose band is wider than a 25 % slowdown cannot rule out one it would have to
catch."""
T_99 = {1: 31.82, 2: 6.965, 3: 4.541, 4: 3.747, 5: 3.365, 6: 3.143, 7: 2.998, 8: 2.896,
        9: 2.821, 10: 2.764, 12: 2.681, 14: 2.624, 16: 2.583, 18: 2.552, 20: 2.528,
        25: 2.485, 30: 2.457, 40: 2.423, 60: 2.390}  # fmt: skip
"""One-sided 99 % quantiles of Student's t by degrees of freedom (between two listed: the
next smaller, the wider; past 60: the normal's 2.326)."""


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
        """Above 1: HEAD is better (ratio of geometric means, oriented)."""
        log_ratio = log_mean(self.head) - log_mean(self.base)
        return math.exp(log_ratio if self.direction == HIGHER else -log_ratio)

    @property
    def degrees_of_freedom(self) -> int:
        return len(self.base) + len(self.head) - 2

    @property
    def noise(self) -> float:
        """One launch's relative spread: the pooled standard deviation of the log figure."""
        squares = sum_of_squares(self.base) + sum_of_squares(self.head)
        return math.sqrt(squares / self.degrees_of_freedom)

    @property
    def standard_error(self) -> float:
        """Of the log speed-up."""
        return self.noise * math.sqrt(1 / len(self.base) + 1 / len(self.head))

    @property
    def band(self) -> float:
        """In log units: a ratio counts outside ``exp(-band)`` .. ``exp(band)``."""
        return max(MIN_BAND, t_99(self.degrees_of_freedom) * self.standard_error)

    @property
    def threshold(self) -> float:
        """The speed-up below which HEAD is a regression."""
        return math.exp(-self.band)

    @property
    def status(self) -> str:
        if self.speedup < self.threshold:
            return "regression"
        if self.band > MAX_BAND:
            return "inconclusive"
        return "faster" if self.speedup > math.exp(self.band) else "same"

    def line(self) -> str:
        return (
            f"{self.variant:<8} {self.figure:<28} base {math.exp(log_mean(self.base)):10.4g}  "
            f"head {math.exp(log_mean(self.head)):10.4g}  speed-up {self.speedup:6.3f}  "
            f"noise {self.noise:6.1%}  regression below {self.threshold:5.3f}  {self.status}"
        )


def log_mean(values: tuple[float, ...]) -> float:
    return statistics.fmean(math.log(v) for v in values)


def sum_of_squares(values: tuple[float, ...]) -> float:
    """Of the log values around their mean."""
    middle = log_mean(values)
    return sum((math.log(v) - middle) ** 2 for v in values)


def t_99(degrees_of_freedom: int) -> float:
    listed = [df for df in T_99 if df <= degrees_of_freedom]
    if degrees_of_freedom > max(T_99):
        return 2.326
    return T_99[max(listed)]


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
