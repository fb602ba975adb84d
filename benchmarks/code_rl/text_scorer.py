"""The code_rl benchmark's baseline scorer: the completion's text against the row's solution
(``extra_info.solution``), nothing run. What a step costs when scoring is almost free; the
sandboxed variants' steps over it are what running the programs adds."""

from __future__ import annotations

from typing import Any


def score(response: str, ground_truth: str | None, extra_info: dict[str, Any]) -> float:
    return float(response.strip() == str(extra_info.get("solution", "")).strip())
