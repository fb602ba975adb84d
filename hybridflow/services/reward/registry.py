"""Scorer registry: which function scores which ``data_source``.

Built-in rule scorers (``arith``, ``gsm8k``, ``math``) plus verl's dataset names as aliases,
and user scorers loaded from import paths at registration time, so a bad path fails when the
service starts, not on the first batch. Lookup is exact first, then the longest registered
name that prefixes the data_source ("openai/gsm8k_socratic" → the gsm8k scorer). This module
does not run scorers or handle their errors (``scorers.py`` does) and knows nothing of grpc.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from hybridflow.services.reward import rules
from hybridflow.services.reward.config import RewardConfig

ScorerFn = Callable[[str, str | None, dict[str, Any]], Any]
"""(response, ground_truth, extra_info) -> float | bool."""

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


def _rule(score: Callable[..., float], **kwargs: Any) -> ScorerFn:
    bound = partial(score, **kwargs)

    def scorer(response: str, ground_truth: str | None, extra_info: dict[str, Any]) -> float:
        assert ground_truth is not None  # the batch scorer checks requires_ground_truth first
        return bound(response, ground_truth)

    return scorer


def load_scorer_function(path: str) -> ScorerFn:
    """Import "package.module:function" (or "path/to/file.py:function"); ValueError if bad.

    The function must accept (response, ground_truth, extra_info) positionally.
    """
    module_name, sep, attr_path = path.rpartition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(
            f"scorer path {path!r}: expected 'package.module:function' or 'file.py:function'"
        )
    is_file = module_name.endswith(".py")
    if is_file and not Path(module_name).is_file():
        raise ValueError(f"scorer path {path!r}: file {module_name!r} does not exist")
    try:
        module = (
            _import_file(Path(module_name)) if is_file else importlib.import_module(module_name)
        )
    except Exception as exc:  # any import-time failure of user code is a config error
        raise ValueError(
            f"scorer path {path!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise ValueError(
                f"scorer path {path!r}: {module_name!r} has no attribute {attr_path!r}"
            )
        target = getattr(target, attr)
    if not callable(target):
        raise ValueError(f"scorer path {path!r}: {attr_path!r} is not callable")
    try:
        inspect.signature(target).bind("", None, {})
    except TypeError as exc:
        raise ValueError(
            f"scorer path {path!r}: must accept (response, ground_truth, extra_info): {exc}"
        ) from exc
    except ValueError:
        pass  # builtins without an introspectable signature: trust the caller
    return cast(ScorerFn, target)


def _import_file(file_path: Path) -> Any:
    resolved = str(file_path.resolve())
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:12]
    module_name = f"hybridflow_user_scorer_{file_path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"{resolved} cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class ScorerRegistry:
    """data_source → Scorer, with built-ins, verl aliases and user scorers."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        config = config or RewardConfig()
        config.validate()
        self._scorers: dict[str, Scorer] = {}
        fmt = config.format_score
        builtins: dict[str, ScorerFn] = {
            "arith": _rule(rules.score_arith, format_score=fmt),
            "gsm8k": _rule(rules.score_gsm8k, method=config.gsm8k_method, format_score=fmt),
            "math": _rule(rules.score_math, format_score=fmt),
        }
        for name, fn in builtins.items():
            self.register(name, fn, requires_ground_truth=True, origin="builtin")
        for alias, target in BUILTIN_ALIASES.items():
            self.register(alias, builtins[target], requires_ground_truth=True, origin="builtin")
        for data_source, path in config.scorers.items():
            self.register_import_path(data_source, path)

    def register(
        self,
        data_source: str,
        fn: ScorerFn,
        *,
        requires_ground_truth: bool = False,
        origin: str = "python",
    ) -> None:
        """Register (or replace) the scorer for ``data_source``."""
        if not data_source:
            raise ValueError("data_source must be a non-empty string")
        if not callable(fn):
            raise ValueError(f"scorer for data_source {data_source!r} is not callable")
        self._scorers[data_source] = Scorer(data_source, fn, requires_ground_truth, origin)

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

    def names(self) -> list[str]:
        """Registered data_source names, sorted."""
        return sorted(self._scorers)
