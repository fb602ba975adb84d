"""The scorer of ``reasoning_gym/<task>`` rows (``data/reasoning_gym.py``): the task's own
``score_answer`` on the response's answer (inside ``<answer>...</answer>`` when it has the
tags, else the whole response, stripped) and the row's entry from ``extra_info``.
reasoning-gym is imported on the first such item (it loads numpy, which a rule-only reward
service never does)."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from hybridflow.data.reasoning_gym import EXTRA_KEY

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def score_reasoning_gym(
    response: str, ground_truth: str | None, extra_info: dict[str, Any]
) -> float:
    """The task's score of the response (0 to 1); ValueError for an item whose extra_info
    lacks the row's entry (not made by ``reasoning_gym:``)."""
    row = extra_info.get(EXTRA_KEY)
    if not isinstance(row, dict) or "task" not in row or not isinstance(row.get("entry"), dict):
        raise ValueError(
            f"a reasoning_gym item needs extra_info[{EXTRA_KEY!r}] with its task and entry "
            "(rows of a reasoning_gym:<task> dataset carry them)"
        )
    tagged = _ANSWER.findall(response)
    answer = (tagged[-1] if tagged else response).strip()
    return float(_score_fn(str(row["task"]))(answer, row["entry"]))


@cache
def _score_fn(task: str) -> Any:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)
