"""The metrics of one evaluation of one held-out set: pure functions over scored groups.

For each prompt the evaluation has ``n`` completions (``coordinator.eval.k``), each with a
score; a completion *passes* when its score is at least the threshold.

- ``mean@n``: the mean score over all completions.
- ``pass@k`` (k = 1 and n): the unbiased estimator of Chen et al. (2021), averaged over
  prompts: ``1 - C(n - c, k) / C(n, k)`` for a prompt with ``c`` passing completions, the
  chance that k completions drawn without replacement hold at least one that passes.
- ``majority@n``: the share of prompts whose most common answer (``answer_of``; ties go to
  the answer seen first) is one a passing completion gave.
- ``length/mean``, ``finish/<reason>``: response tokens, and the share of completions that
  stopped (``stop``) or hit the limit (``length``).
- multi-turn episodes: ``success_rate``, ``turns/mean``, ``tool_calls/mean``,
  ``tool_use_rate`` from their records.

Each metric is also given per data source (``<source>/<metric>``) when a set has more than
one. Knows nothing of services, versions or where the samples came from.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from hybridflow.arrays import TokenArray
from hybridflow.coordinator.dataflow import ScoredGroup

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``n`` completions, ``c`` of them passing:
    ``1 - C(n - c, k) / C(n, k)`` (1 when fewer than k fail)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def answer_of(text: str) -> str:
    """The answer a completion gives, for majority voting: the last ``\\boxed{...}``, else the
    last number, else the whole text stripped."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1]
    return text.strip()


def majority_passes(answers: Sequence[str], passed: Sequence[bool]) -> bool:
    """Whether the most common of ``answers`` (ties: the first seen) is one that passed."""
    if not answers:
        return False
    counts = Counter(answers)
    top = max(counts.values())
    winner = next(a for a in answers if counts[a] == top)
    return any(p for a, p in zip(answers, passed, strict=True) if a == winner)


def set_metrics(
    groups: Sequence[ScoredGroup], threshold: float, decode: Callable[[TokenArray], str]
) -> dict[str, float]:
    """The metrics of one set's scored groups (keys without the ``eval/<name>/`` prefix);
    per data source too when there is more than one. ``decode``: response ids -> text (for
    the answers)."""
    out = _metrics(groups, threshold, decode)
    by_source: dict[str, list[ScoredGroup]] = defaultdict(list)
    for group in groups:
        by_source[group.prompt.data_source].append(group)
    if len(by_source) > 1:
        for source, members in sorted(by_source.items()):
            out.update(
                {f"{source}/{k}": v for k, v in _metrics(members, threshold, decode).items()}
            )
    return out


def _metrics(
    groups: Sequence[ScoredGroup], threshold: float, decode: Callable[[TokenArray], str]
) -> dict[str, float]:
    if not groups:
        return {}
    n = min(len(g.results) for g in groups)
    scores = [r.score for g in groups for r in g.results]
    completions = [c for g in groups for c in g.completions]
    num = len(completions)
    out = {
        f"mean@{n}": sum(scores) / len(scores),
        "pass@1": _mean(pass_at_k(n, _passed(g, threshold, n), 1) for g in groups),
        "length/mean": sum(len(c.token_ids) for c in completions) / num,
        "finish/stop": sum(c.finish_reason == "stop" for c in completions) / num,
        "finish/length": sum(c.finish_reason == "length" for c in completions) / num,
        "num_prompts": float(len(groups)),
        "num_errors": float(sum(r.error is not None for g in groups for r in g.results)),
    }
    if n > 1:
        out[f"pass@{n}"] = _mean(pass_at_k(n, _passed(g, threshold, n), n) for g in groups)
        out[f"majority@{n}"] = _mean(
            float(
                majority_passes(
                    [answer_of(decode(c.token_ids)) for c in g.completions[:n]],
                    [r.score >= threshold for r in g.results[:n]],
                )
            )
            for g in groups
        )
    records = [r for g in groups for r in (g.episodes or ())]
    if records:
        out.update(
            {
                "success_rate": _mean(float(r.success) for r in records),
                "turns/mean": _mean(float(r.turns) for r in records),
                "tool_calls/mean": _mean(float(r.tool_calls) for r in records),
                "tool_use_rate": _mean(float(r.tool_calls > 0) for r in records),
            }
        )
    return out


def _passed(group: ScoredGroup, threshold: float, n: int) -> int:
    return sum(r.score >= threshold for r in group.results[:n])


def _mean(values: object) -> float:
    items = list(values)  # type: ignore[call-overload]
    return sum(items) / len(items) if items else 0.0
