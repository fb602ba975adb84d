"""Range checks for the config dataclasses' ``validate()``: every bad value of a section at once.

Each check returns a problem line (``key: must be >= 1, got -3``) or None; ``raise_problems``
raises one ValueError holding every line (the loader reports it as a ConfigError, preflight
prints one line each). NaN and infinities fail every check. No torch, no grpc.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def _number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def at_least(key: str, value: float, low: float) -> str | None:
    """``value >= low``."""
    return None if _number(value) and value >= low else f"{key}: must be >= {low}, got {value}"


def above(key: str, value: float, low: float) -> str | None:
    """``value > low``."""
    return None if _number(value) and value > low else f"{key}: must be > {low}, got {value}"


def within(key: str, value: float, low: float, high: float) -> str | None:
    """``low <= value <= high``."""
    if _number(value) and low <= value <= high:
        return None
    return f"{key}: must be in [{low}, {high}], got {value}"


def raise_problems(problems: Iterable[str | None]) -> None:
    """One ValueError with every problem, one per line; nothing when all are None."""
    lines = [p for p in problems if p]
    if lines:
        raise ValueError("\n".join(lines))
