"""What one multi-turn episode did, and the ``episode/*`` metrics of a batch of them.

Plain data below both ``dataflow`` (a ``ScoredGroup`` carries its completions' records) and
``episodes`` (the loop that fills them in); it knows nothing of environments or engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class EpisodeRecord:
    """What one episode did (for metrics and the run's records)."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    success: bool = False
    env_seconds: float = 0.0
    env_calls: int = 0
    policy_tokens: int = 0
    total_tokens: int = 0
    finish: str = ""
    """``done``, ``max_turns``, ``max_total_tokens`` or ``error``."""
    segment_breaks: int = 0
    """Agent episodes: requests that did not extend the episode's context (its segments
    minus one, under ``on_break: split``)."""


def episode_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """``episode/*`` metrics of one batch's episodes."""
    if not records:
        return {}
    n = len(records)
    env_calls = sum(r.env_calls for r in records)
    successes = sum(r.success for r in records)
    total = sum(r.total_tokens for r in records)
    finishes = {"done": 0, "max_turns": 0, "max_total_tokens": 0, "error": 0}
    for r in records:
        finishes[r.finish] = finishes.get(r.finish, 0) + 1
    return {
        "episode/turns/mean": sum(r.turns for r in records) / n,
        "episode/turns/max": float(max(r.turns for r in records)),
        "episode/tool_calls/mean": sum(r.tool_calls for r in records) / n,
        "episode/tool_errors/mean": sum(r.tool_errors for r in records) / n,
        "episode/tool_use_rate": sum(r.tool_calls > 0 for r in records) / n,
        "episode/success_rate": sum(r.success for r in records) / n,
        "episode/turns_per_success": (
            sum(r.turns for r in records if r.success) / successes if successes else 0.0
        ),
        "episode/env_latency_s/mean": (
            sum(r.env_seconds for r in records) / env_calls if env_calls else 0.0
        ),
        "episode/policy_token_frac": (
            sum(r.policy_tokens for r in records) / total if total else 1.0
        ),
        **{f"episode/finish/{name}": count / n for name, count in finishes.items()},
        "episode/segment_breaks/mean": sum(r.segment_breaks for r in records) / n,
    }
