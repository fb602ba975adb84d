"""Scorer registry: which function scores which ``data_source``.

Built-in rule scorers (``arith``, ``gsm8k``, ``math``, ``math_verify``: Hugging Face's
math-verify, in child processes with a deadline; ``reasoning_gym/<task>``: the task's own
``score_answer``; ``code``: the program run against its tests in the sandbox pool) plus verl's
dataset names as aliases,
the ground-truth-free ``sharegpt`` stand-in (``rules.score_plain_text``: form, not quality),
and user scorers loaded from import paths at registration time, so a bad path fails when the
service starts, not on the first batch. Lookup is exact first, then the longest registered
name that prefixes the data_source ("openai/gsm8k_socratic" → the gsm8k scorer). This module
does not run scorers or handle their errors (``scorers.py`` does) and knows nothing of grpc.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from hybridflow.config.import_path import load_callable
from hybridflow.data.reasoning_gym import DATA_SOURCE_PREFIX as REASONING_GYM_SOURCE
from hybridflow.data.sharegpt import SHAREGPT_DATA_SOURCE
from hybridflow.services.reward import rules
from hybridflow.services.reward.code_scorer import DATA_SOURCE as CODE_SOURCE
from hybridflow.services.reward.code_scorer import CodeScorer
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.reward.math_verify_scorer import BoundedMathVerify
from hybridflow.services.reward.reasoning_gym_scorer import score_reasoning_gym

ScorerFn = Callable[[str, str | None, dict[str, Any]], Any]
"""(response, ground_truth, extra_info) -> float | bool | Verdict."""

BUILTIN_ALIASES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
}
"""verl dataset names → built-in scorer (verl's ``default_compute_score`` table)."""


@dataclass(frozen=True)
class Scorer:
    """One registered scoring function."""

    name: str
    """Registered data_source key (the scorer's name in error messages)."""
    fn: ScorerFn
    """(response, ground_truth, extra_info) -> float | bool."""
    requires_ground_truth: bool
    """Items without a ground truth are errors instead of calls."""
    origin: str
    """"builtin" or the import path it was loaded from."""
    threads: int = 1
    """Calls of it worth running at once (the code scorer: its sandbox pool's slots)."""


def _rule(score: Callable[..., float], **kwargs: Any) -> ScorerFn:
    bound = partial(score, **kwargs)

    def scorer(response: str, ground_truth: str | None, extra_info: dict[str, Any]) -> float:
        assert ground_truth is not None  # the batch scorer checks requires_ground_truth first
        return bound(response, ground_truth)

    return scorer


def _plain_text(response: str, ground_truth: str | None, extra_info: dict[str, Any]) -> float:
    return rules.score_plain_text(response)


def load_scorer_function(path: str) -> ScorerFn:
    """Import "package.module:function" (or "path/to/file.py:function"); ValueError if bad.

    The function must accept (response, ground_truth, extra_info) positionally.
    """
    fn = load_callable(path, "scorer", ("", None, {}), "(response, ground_truth, extra_info)")
    return cast(ScorerFn, fn)


class ScorerRegistry:
    """data_source → Scorer, with built-ins, verl aliases and user scorers."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        config = config or RewardConfig()
        config.validate()
        self._scorers: dict[str, Scorer] = {}
        fmt = config.format_score
        self.math_verify = BoundedMathVerify(
            config.score_workers, config.math_verify_timeout_s, fmt
        )
        """math-verify's child processes (started on first use); ``close`` kills them."""
        self.code = CodeScorer(config.sandbox, config.code_score == "all", config.code_cache_size)
        """The sandbox pool of the ``code`` scorer (started on first use); ``close`` stops it."""
        builtins: dict[str, ScorerFn] = {
            "arith": _rule(rules.score_arith, format_score=fmt),
            "gsm8k": _rule(rules.score_gsm8k, method=config.gsm8k_method, format_score=fmt),
            "math": (
                self.math_verify
                if config.math_method == "math_verify"
                else _rule(rules.score_math, format_score=fmt)
            ),
            "math_verify": self.math_verify,
        }
        for name, fn in builtins.items():
            self.register(name, fn, requires_ground_truth=True, origin="builtin")
        for alias, target in BUILTIN_ALIASES.items():
            self.register(alias, builtins[target], requires_ground_truth=True, origin="builtin")
        self.register(SHAREGPT_DATA_SOURCE, _plain_text, origin="builtin")
        # every reasoning_gym/<task>: the task's own score_answer (the entry in extra_info)
        self.register(REASONING_GYM_SOURCE, score_reasoning_gym, origin="builtin")
        self.register(
            CODE_SOURCE,
            self.code,
            requires_ground_truth=True,
            origin="builtin",
            threads=self.code.threads,
        )
        for data_source, path in config.scorers.items():
            self.register_import_path(data_source, path)

    def register(
        self,
        data_source: str,
        fn: ScorerFn,
        *,
        requires_ground_truth: bool = False,
        origin: str = "python",
        threads: int = 1,
    ) -> None:
        """Register (or replace) the scorer for ``data_source``."""
        if not data_source:
            raise ValueError("data_source must be a non-empty string")
        if not callable(fn):
            raise ValueError(f"scorer for data_source {data_source!r} is not callable")
        self._scorers[data_source] = Scorer(data_source, fn, requires_ground_truth, origin, threads)

    def register_import_path(self, data_source: str, path: str) -> None:
        """Import a user scorer now (ValueError naming data_source and path if it is bad).

        User scorers receive ``ground_truth=None`` when an item has none; they decide."""
        try:
            fn = load_scorer_function(path)
        except ValueError as exc:
            raise ValueError(f"reward.scorers[{data_source!r}]: {exc}") from exc
        self.register(data_source, fn, requires_ground_truth=False, origin=path)

    def resolve(self, data_source: str) -> Scorer | None:
        """Exact match, else the longest registered name prefixing data_source, else None."""
        exact = self._scorers.get(data_source)
        if exact is not None:
            return exact
        prefixes = [name for name in self._scorers if data_source.startswith(name)]
        return self._scorers[max(prefixes, key=len)] if prefixes else None

    def threads(self) -> dict[str, int]:
        """Registered name -> calls of its scorer worth running at once."""
        return {name: scorer.threads for name, scorer in self._scorers.items()}

    def names(self) -> list[str]:
        """Registered data_source names, sorted."""
        return sorted(self._scorers)

    def close(self) -> None:
        """Stops the built-ins' child processes (math-verify's, the sandbox pool's;
        idempotent)."""
        self.math_verify.close()
        self.code.close()
