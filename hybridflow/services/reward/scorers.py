"""Batch scoring: run the registered scorer of each item, isolating failures per item.

``RewardScorer.score_batch`` never fails because of one item: an unknown data_source, a
missing ground truth (for scorers that need one), an exception in the scorer, a return value
that is not a number (or a ``Verdict``), or a non-finite score gives *that* item
``ScoreResult(0.0, error=...)`` with a message naming the item index and the problem, and
bumps a per-kind error counter. Only a malformed request (more items than ``max_batch_size``)
raises ValueError, and a scorer that cannot work on this machine at all (the code scorer
without its sandbox) raises ``FailedPrecondition``: scoring every item 0 would hide it.

A scorer may return a ``Verdict`` (a score with a named outcome, kept in
``ScoreResult.outcome``). Items are scored in this thread, or by ``score_workers`` threads,
or, for a batch with items of a scorer that runs several calls at once (``Scorer.threads``:
the code scorer's sandbox slots), by that many.

With ``reward.components`` each item's score is the weighted sum of the components that apply
to it (a rule scorer or a reward model, see ``RewardComponent``), and ``ScoreResult.components``
holds each one's unweighted score. An item is an error (score 0, no component scores) when one
of its components fails on it (the message names the component) or when none applies to it
(kind ``no_component``). Without components nothing changes: the data_source's rule alone.

This module imports no grpc and no torch (reward models load torch only when configured) and
reads no environment; the servicer wraps it.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hybridflow.errors import FailedPrecondition
from hybridflow.services.reward.config import RewardComponent, RewardConfig
from hybridflow.services.reward.item_error import ItemError
from hybridflow.services.reward.model_scorer import ModelScorer, ScoreOrError
from hybridflow.services.reward.registry import ScorerRegistry
from hybridflow.types import ScoreItem, ScoreResult, Verdict

ERROR_KINDS = (
    "unknown_data_source",
    "missing_ground_truth",
    "scorer_exception",
    "bad_return_type",
    "non_finite_score",
    "too_long",
    "model_error",
    "no_component",
)
"""Keys of ``RewardScorer.error_counts``."""


def applies(component: RewardComponent, data_source: str) -> bool:
    """Whether ``component`` scores items of ``data_source`` (equal to or prefixed by one of
    its ``data_sources``; every data_source when it lists none)."""
    if not component.data_sources:
        return True
    return any(data_source.startswith(prefix) for prefix in component.data_sources)


class RewardScorer:
    """Scores batches of ``ScoreItem`` with the scorers of a ``ScorerRegistry``."""

    def __init__(self, config: RewardConfig | None = None, registry: ScorerRegistry | None = None):
        self.config = config or RewardConfig()
        self.config.validate()
        self.registry = registry if registry is not None else ScorerRegistry(self.config)
        self._lock = threading.Lock()
        self._errors: Counter[str] = Counter()
        self._num_scored = 0
        self._pool: ThreadPoolExecutor | None = None
        most = max([self.config.score_workers, *self.registry.threads().values()])
        if most > 1:
            self._pool = ThreadPoolExecutor(most, "reward-scorer")
        self._models: dict[str, ModelScorer] = {}
        for i, component in enumerate(self.config.components):
            key = f"reward.components[{i}]"
            if component.kind == "model":
                self._models[component.name] = ModelScorer(component, key)
            elif component.scorer is not None and self.registry.resolve(component.scorer) is None:
                raise ValueError(
                    f"{key}.scorer: {component.scorer!r} is not a registered scorer; "
                    f"registered: {self.registry.names()}"
                )

    def score_batch(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """One ScoreResult per item, in order; per-item failures become errored results."""
        if len(items) > self.config.max_batch_size:
            raise ValueError(
                f"items: batch of {len(items)} exceeds reward.max_batch_size "
                f"({self.config.max_batch_size})"
            )
        if self.config.components:
            return self._score_combined(items)
        return self._map(self.score_item, range(len(items)), items)

    def _map(self, fn: Callable[..., Any], *args: Sequence[Any]) -> list[Any]:
        """``fn`` over ``args`` (the last holds the items) in the scoring threads, or in this
        thread when the batch's scorers need none."""
        if self._pool is not None and len(args[0]) > 1 and self._threads_for(args[-1]) > 1:
            return list(self._pool.map(fn, *args))
        return [fn(*a) for a in zip(*args)]

    def _threads_for(self, items: Sequence[ScoreItem]) -> int:
        """Threads worth scoring ``items`` with: ``score_workers``, or more for a scorer
        that runs several calls at once."""
        scorers = [self.registry.resolve(s) for s in {self._data_source(it) for it in items}]
        return max([self.config.score_workers, *(s.threads for s in scorers if s is not None)])

    def score_item(self, index: int, item: ScoreItem) -> ScoreResult:
        """Score one item with its data_source's rule; ``index`` only labels error messages."""
        try:
            score, outcome = self._rule_score(item, None)
        except ItemError as err:
            return self._failed(index, err.kind, str(err))
        return self._scored(ScoreResult(score=score, outcome=outcome))

    def _failed(self, index: int, kind: str, message: str) -> ScoreResult:
        with self._lock:
            self._errors[kind] += 1
            self._num_scored += 1
        return ScoreResult(score=0.0, error=f"item {index}: {message}")

    def _scored(self, result: ScoreResult) -> ScoreResult:
        with self._lock:
            self._num_scored += 1
        return result

    def _data_source(self, item: ScoreItem) -> str:
        return item.data_source or self.config.default_data_source or ""

    def _score_combined(self, items: list[ScoreItem]) -> list[ScoreResult]:
        scores: list[dict[str, float]] = [{} for _ in items]
        failures: list[list[tuple[str, ItemError]]] = [[] for _ in items]
        for component in self.config.components:
            chosen = [i for i, it in enumerate(items) if applies(component, self._data_source(it))]
            outcomes = self._run_component(component, [items[i] for i in chosen])
            for i, outcome in zip(chosen, outcomes):
                if isinstance(outcome, ItemError):
                    failures[i].append((component.name, outcome))
                else:
                    scores[i][component.name] = outcome
        return [self._combine(i, items[i], scores[i], failures[i]) for i in range(len(items))]

    def _run_component(
        self, component: RewardComponent, items: list[ScoreItem]
    ) -> list[ScoreOrError]:
        if not items:
            return []
        model = self._models.get(component.name)
        if model is not None:
            return model.score(items)
        return self._map(self._rule_outcome, [component.scorer] * len(items), items)

    def _rule_outcome(self, scorer_name: str | None, item: ScoreItem) -> ScoreOrError:
        try:
            return self._rule_score(item, scorer_name)[0]
        except ItemError as err:
            return err

    def _combine(
        self,
        index: int,
        item: ScoreItem,
        scores: dict[str, float],
        failures: list[tuple[str, ItemError]],
    ) -> ScoreResult:
        """The weighted sum of an item's component scores, or its error."""
        if failures:
            message = "; ".join(f"component {name!r}: {err}" for name, err in failures)
            return self._failed(index, failures[0][1].kind, message)
        if not scores:
            names = [c.name for c in self.config.components]
            message = (
                f"no reward component applies to data_source {self._data_source(item)!r} "
                f"(components: {names})"
            )
            return self._failed(index, "no_component", message)
        weights = {c.name: c.weight for c in self.config.components}
        total = sum(weights[name] * score for name, score in scores.items())
        return self._scored(ScoreResult(score=total, components=scores))

    def _rule_score(self, item: ScoreItem, scorer_name: str | None) -> tuple[float, str]:
        """The rule score of one item and its named outcome ("" when the scorer names
        none): the named scorer's, else its data_source's."""
        data_source = item.data_source or self.config.default_data_source
        if scorer_name is not None:
            scorer = self.registry.resolve(scorer_name)
            assert scorer is not None  # checked when the components were built
            data_source = data_source or scorer_name
        elif not data_source:
            raise ItemError(
                "unknown_data_source",
                "empty data_source and no reward.default_data_source configured",
            )
        else:
            scorer = self.registry.resolve(data_source)
        if scorer is None:
            raise ItemError(
                "unknown_data_source",
                f"unknown data_source {data_source!r}; registered: {self.registry.names()}",
            )
        has_truth = isinstance(item.ground_truth, str) and item.ground_truth.strip() != ""
        if scorer.requires_ground_truth and not has_truth:
            raise ItemError(
                "missing_ground_truth",
                f"data_source {data_source!r} (scorer {scorer.name!r}) needs a ground truth, "
                f"got {item.ground_truth!r}",
            )
        label = f"scorer {scorer.name!r} ({scorer.origin}) for data_source {data_source!r}"
        try:
            raw: Any = scorer.fn(item.response, item.ground_truth, dict(item.extra_info or {}))
        except FailedPrecondition:
            raise  # the scorer cannot work here at all: the call fails, naming why
        except Exception as exc:  # user code: any failure belongs to this item only
            raise ItemError(
                "scorer_exception", f"{label} raised {type(exc).__name__}: {exc}"
            ) from exc
        outcome = ""
        if isinstance(raw, Verdict):
            raw, outcome = raw.score, str(raw.outcome)
        if not isinstance(raw, numbers.Real):
            raise ItemError(
                "bad_return_type",
                f"{label} returned {type(raw).__name__} {raw!r}, expected float, bool or Verdict",
            )
        score = float(raw)
        if not math.isfinite(score):
            raise ItemError("non_finite_score", f"{label} returned non-finite score {score}")
        return score, outcome

    @property
    def error_counts(self) -> dict[str, int]:
        """Errors so far by kind (every kind of ``ERROR_KINDS`` present, zeros included)."""
        with self._lock:
            return {kind: self._errors[kind] for kind in ERROR_KINDS}

    @property
    def num_truncated(self) -> int:
        """Items the reward models cut to their max_length (``truncate`` components)."""
        return sum(model.num_truncated for model in self._models.values())

    @property
    def num_scored(self) -> int:
        """Items scored so far, errored ones included."""
        with self._lock:
            return self._num_scored

    def close(self) -> None:
        """Stop the scoring threads and the built-ins' processes (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.registry.close()


def score_batch(items: list[ScoreItem], config: RewardConfig | None = None) -> list[ScoreResult]:
    """Score one batch with a fresh ``RewardScorer`` (convenience for scripts and tests)."""
    scorer = RewardScorer(config)
    try:
        return scorer.score_batch(items)
    finally:
        scorer.close()
