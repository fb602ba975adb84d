"""ShareGPT conversations as prompt rows: ``sharegpt:PATH`` in ``coordinator.data``.

A ShareGPT file is a JSON list (``.json``) or JSON lines (``.jsonl``) of conversations,
``{"id": ..., "conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}``.
The first human turn (``from`` "human" or "user") becomes a single-message chat prompt; the
rest of the conversation is not used (RL generates its own responses). Rows get
``data_source: sharegpt`` and no ground truth; the reward service scores them with its
``sharegpt`` scorer, a form-only stand-in until a reward model serves them.

This module turns conversations into verl-format rows; ``datasets.py`` reads, checks and
tokenises them. It knows nothing of tokenizers or rewards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SHAREGPT_PREFIX = "sharegpt:"
"""``coordinator.data`` specs starting with this name a ShareGPT file (``sharegpt:PATH``)."""
SHAREGPT_DATA_SOURCE = "sharegpt"
"""data_source of ShareGPT rows: picks the reward service's ``sharegpt`` scorer."""
HUMAN_ROLES = ("human", "user")
"""``from`` values of a human turn."""


def sharegpt_row(conversation: Any, where: str) -> dict[str, Any]:
    """The verl-format row of one conversation: its first human turn as the prompt.

    ValueError naming ``where`` and the field when the conversation has no usable human turn.
    """
    if not isinstance(conversation, dict):
        raise ValueError(
            f"{where}: expected an object per conversation, got {type(conversation).__name__}"
        )
    turns = conversation.get("conversations")
    if not isinstance(turns, list):
        raise ValueError(f"{where}: field 'conversations' must be a list of turns, got {turns!r}")
    for i, turn in enumerate(turns):
        if isinstance(turn, dict) and turn.get("from") in HUMAN_ROLES:
            value = turn.get("value")
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"{where}: field 'conversations[{i}].value' must be a non-empty string"
                )
            extra = {} if conversation.get("id") is None else {"id": conversation["id"]}
            return {
                "prompt": [{"role": "user", "content": value}],
                "data_source": SHAREGPT_DATA_SOURCE,
                "extra_info": extra,
            }
    raise ValueError(f"{where}: field 'conversations' has no human turn (from: human or user)")


def iter_json_list(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, conversation) pairs of a JSON-list file (read whole: ShareGPT's format)."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8: {exc.reason}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON: {exc.msg} (line {exc.lineno})") from exc
    if not isinstance(loaded, list):
        raise ValueError(
            f"{path}: expected a JSON list of conversations, got {type(loaded).__name__}"
        )
    return ((f"{path} conversation {i}", item) for i, item in enumerate(loaded))
