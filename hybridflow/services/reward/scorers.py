"""Batch scoring: run the registered scorer of each item, isolating failures per item.

``RewardScorer.score_batch`` never fails because of one item: an unknown data_source, a
missing ground truth (for scorers that need one), an exception in the scorer, a return value
that is not a number, or a non-finite score gives *that* item ``ScoreResult(0.0, error=...)``
with a message naming the item index and the problem, and bumps a per-kind error counter.
Only a malformed request (more items than ``max_batch_size``) raises ValueError. This module
is pure Python: no grpc, no torch, no environment reads; the servicer wraps it.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.registry import ScorerRegistry
from hybridflow.types import ScoreItem, ScoreResult

ERROR_KINDS = (
    "unknown_data_source",
    "missing_ground_truth",
    "scorer_exception",
    "bad_return_type",
    "non_finite_score",
)
"""Keys of ``RewardScorer.error_counts``."""


class _ItemError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


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
        if self.config.num_threads > 1:
            self._pool = ThreadPoolExecutor(self.config.num_threads, "reward-scorer")

    def score_batch(self, items: list[ScoreItem]) -> list[ScoreResult]:
        """One ScoreResult per item, in order; per-item failures become errored results."""
        if len(items) > self.config.max_batch_size:
            raise ValueError(
                f"items: batch of {len(items)} exceeds reward.max_batch_size "
                f"({self.config.max_batch_size})"
            )
        if self._pool is not None and len(items) > 1:
            results = list(self._pool.map(self.score_item, range(len(items)), items))
        else:
            results = [self.score_item(index, item) for index, item in enumerate(items)]
        return results

    def score_item(self, index: int, item: ScoreItem) -> ScoreResult:
        """Score one item; ``index`` only labels error messages."""
        try:
            score = self._score(item)
        except _ItemError as err:
            with self._lock:
                self._errors[err.kind] += 1
                self._num_scored += 1
            return ScoreResult(score=0.0, error=f"item {index}: {err}")
        with self._lock:
            self._num_scored += 1
        return ScoreResult(score=score)

    def _score(self, item: ScoreItem) -> float:
        data_source = item.data_source or self.config.default_data_source
        if not data_source:
            raise _ItemError(
                "unknown_data_source",
                "empty data_source and no reward.default_data_source configured",
            )
        scorer = self.registry.resolve(data_source)
        if scorer is None:
            raise _ItemError(
                "unknown_data_source",
                f"unknown data_source {data_source!r}; registered: {self.registry.names()}",
            )
        has_truth = isinstance(item.ground_truth, str) and item.ground_truth.strip() != ""
        if scorer.requires_ground_truth and not has_truth:
            raise _ItemError(
                "missing_ground_truth",
                f"data_source {data_source!r} (scorer {scorer.name!r}) needs a ground truth, "
                f"got {item.ground_truth!r}",
            )
        label = f"scorer {scorer.name!r} ({scorer.origin}) for data_source {data_source!r}"
        try:
            raw: Any = scorer.fn(item.response, item.ground_truth, dict(item.extra_info or {}))
        except Exception as exc:  # user code: any failure belongs to this item only
            raise _ItemError(
                "scorer_exception", f"{label} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(raw, numbers.Real):
            raise _ItemError(
                "bad_return_type",
                f"{label} returned {type(raw).__name__} {raw!r}, expected float or bool",
            )
        score = float(raw)
        if not math.isfinite(score):
            raise _ItemError("non_finite_score", f"{label} returned non-finite score {score}")
        return score

    @property
    def error_counts(self) -> dict[str, int]:
        """Errors so far by kind (every kind of ``ERROR_KINDS`` present, zeros included)."""
        with self._lock:
            return {kind: self._errors[kind] for kind in ERROR_KINDS}

    @property
    def num_scored(self) -> int:
        """Items scored so far, errored ones included."""
        with self._lock:
            return self._num_scored

    def close(self) -> None:
        """Stop the scoring threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def score_batch(items: list[ScoreItem], config: RewardConfig | None = None) -> list[ScoreResult]:
    """Score one batch with a fresh ``RewardScorer`` (convenience for scripts and tests)."""
    scorer = RewardScorer(config)
    try:
        return scorer.score_batch(items)
    finally:
        scorer.close()
