"""Pure dataflow steps of one training step: split, score items, train samples, metrics.

No clients, no threads, no I/O: the schedule calls these between service calls.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hybridflow.arrays import TokenArray
from hybridflow.coordinator.episode_record import EpisodeRecord, episode_metrics
from hybridflow.types import Completion, ScoreItem, ScoreResult, TrainSample


class Prompt(Protocol):
    """What the dataflow needs of a dataset row (hybridflow.data.datasets.PromptRecord)."""

    prompt_text: str
    prompt_ids: TokenArray
    data_source: str
    ground_truth: str | None
    extra_info: dict[str, Any]
    index: int


@dataclass
class ScoredGroup:
    """All completions of one prompt with their scores."""

    prompt: Prompt
    completions: list[Completion]
    results: list[ScoreResult]
    baseline: float | None = None
    """Score of the prompt's greedy response (ReMax's baseline); None when none was made."""
    episodes: list[EpisodeRecord] | None = None
    """Multi-turn: each completion's ``EpisodeRecord`` (``coordinator.episode_record``)."""


def split_round_robin(num_items: int, num_workers: int) -> list[list[int]]:
    """Item indices per worker, round-robin (worker w gets w, w+N, w+2N, ...)."""
    if num_workers < 1:
        raise ValueError("need at least one worker")
    return [list(range(w, num_items, num_workers)) for w in range(num_workers)]


def score_items(
    prompts: Sequence[Prompt],
    groups: Sequence[Sequence[Completion]],
    decode: Callable[[TokenArray], str],
    greedy: Sequence[Sequence[Completion]] | None = None,
) -> list[ScoreItem]:
    """One ScoreItem per completion, prompt-major (the response decoded once, for scoring);
    with ``greedy`` (one greedy completion per prompt) one more item per prompt after them."""
    if greedy is not None:
        if len(greedy) != len(prompts) or any(len(g) != 1 for g in greedy):
            raise ValueError(
                f"greedy baselines: expected one completion for each of {len(prompts)} "
                f"prompts, got {[len(g) for g in greedy]}"
            )
        groups = [*groups, *greedy]
        prompts = [*prompts, *prompts]
    return [
        ScoreItem(
            data_source=p.data_source,
            response=decode(c.token_ids),
            ground_truth=p.ground_truth,
            prompt=p.prompt_text,
            extra_info=p.extra_info,
        )
        for p, group in zip(prompts, groups)
        for c in group
    ]


def attach_scores(
    prompts: Sequence[Prompt],
    groups: Sequence[Sequence[Completion]],
    results: Sequence[ScoreResult],
    with_baselines: bool = False,
) -> list[ScoredGroup]:
    """Groups with their scores; ``with_baselines``: ``results`` end with one greedy baseline
    score per prompt (``score_items(..., greedy=...)``'s order)."""
    num_completions = sum(len(g) for g in groups)
    expected = num_completions + (len(prompts) if with_baselines else 0)
    if expected != len(results):
        raise ValueError(f"{len(results)} scores for {expected} completions")
    out = []
    start = 0
    for i, (p, group) in enumerate(zip(prompts, groups)):
        baseline = float(results[num_completions + i].score) if with_baselines else None
        out.append(ScoredGroup(p, list(group), list(results[start : start + len(group)]), baseline))
        start += len(group)
    return out


def train_samples(scored: Sequence[ScoredGroup], first_group_id: int = 0) -> list[TrainSample]:
    """Flattens scored groups into learner samples; each prompt's samples share a group id."""
    samples = []
    for offset, group in enumerate(scored):
        for completion, result in zip(group.completions, group.results):
            samples.append(
                TrainSample(
                    prompt_ids=(  # arrays shared, never copied here
                        completion.prompt_ids
                        if completion.prompt_ids is not None
                        else group.prompt.prompt_ids
                    ),
                    response_ids=completion.token_ids,
                    rollout_logprobs=completion.logprobs,
                    reward=float(result.score),
                    group_id=first_group_id + offset,
                    policy_version=completion.policy_version,
                    baseline=group.baseline,
                    routed_experts=completion.routed_experts,
                    loss_mask=completion.loss_mask,
                    turn_rewards=completion.turn_rewards if result.error is None else None,
                )
            )
    return samples


def component_means(results: Iterable[ScoreResult]) -> dict[str, float]:
    """``reward/<name>/mean`` of each reward component over the results that carry it."""
    totals: dict[str, list[float]] = {}
    for result in results:
        for name, score in result.components.items():
            totals.setdefault(name, []).append(score)
    return {f"reward/{name}/mean": sum(v) / len(v) for name, v in sorted(totals.items())}


def outcome_shares(results: Sequence[ScoreResult]) -> dict[str, float]:
    """``reward/outcome/<outcome>``: the share of the results whose scorer named that
    outcome (a code scorer's ``passed``, ``timeout``, ...), for each outcome named."""
    counts = Counter(r.outcome for r in results if r.outcome)
    n = max(len(results), 1)
    return {f"reward/outcome/{name}": count / n for name, count in sorted(counts.items())}


def rollout_metrics(scored: Sequence[ScoredGroup]) -> dict[str, float]:
    """verl-style data metrics of one batch: score, response length, errors, solve rates, the
    mean greedy baseline score per prompt when the groups carry one, ``reward/<name>/mean``
    for each reward component (over the samples it scored) and the shares of the outcomes
    the scorers named (``outcome_shares``)."""
    scores = [r.score for g in scored for r in g.results]
    lengths = [len(c.token_ids) for g in scored for c in g.completions]
    clipped = [c.finish_reason == "length" for g in scored for c in g.completions]
    errors = sum(r.error is not None for g in scored for r in g.results)
    n = max(len(scores), 1)
    mean = sum(scores) / n
    var = sum((s - mean) ** 2 for s in scores) / n
    baselines = [g.baseline for g in scored if g.baseline is not None]
    baseline_metrics = (
        {"rollout/baseline_score/mean": sum(baselines) / len(baselines)} if baselines else {}
    )
    records = [r for g in scored for r in (g.episodes or ())]
    if records:
        baseline_metrics.update(episode_metrics(records))
    return {
        **baseline_metrics,
        **component_means(r for g in scored for r in g.results),
        **outcome_shares([r for g in scored for r in g.results]),
        "critic/score/mean": mean,
        "critic/score/std": math.sqrt(var),
        "critic/score/max": max(scores, default=0.0),
        "critic/score/min": min(scores, default=0.0),
        "response_length/mean": sum(lengths) / n,
        "response_length/max": float(max(lengths, default=0)),
        "response_length/clip_ratio": sum(clipped) / n,
        "reward/num_errors": float(errors),
        "batch/num_samples": float(len(scores)),
        "batch/solve_all": sum(all(r.score >= 1 for r in g.results) for g in scored)
        / max(len(scored), 1),
        "batch/solve_none": sum(all(r.score <= 0 for r in g.results) for g in scored)
        / max(len(scored), 1),
    }
