"""How long a prompt may be: the configured ``coordinator.max_prompt_tokens``, bounded by the
model's positions less the response's tokens.

A prompt of ``p`` tokens and a response of up to ``max_new_tokens`` need ``p + max_new_tokens``
positions; a model has ``max_position_embeddings`` of them. Beyond that, vLLM refuses the
request and a Hugging Face model extrapolates its positions without a word. So the prompt
limit is the smaller of the two, the dataset loader drops (and counts) longer prompts, and
the coordinator says which bound it used. A dataset left empty by the limit is an error that
names the limit and the shortest prompt, not "the dataset is empty".

Reads the model's ``config.json`` only (no torch, no transformers): the coordinator imports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def model_positions(model_dir: str | Path) -> int | None:
    """The model's number of positions, from its ``config.json`` (a multimodal config's
    ``text_config`` first); None when the file or the field is missing."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for section in (config.get("text_config") or {}, config):
        for key in _POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


@dataclass(frozen=True)
class PromptLimit:
    """The longest prompt the job accepts, and the bound that set it."""

    tokens: int
    """Prompts with more tokens than this are dropped."""
    reason: str
    """Which bound set it, for the log and for errors."""


def prompt_limit(max_prompt_tokens: int, max_new_tokens: int, positions: int | None) -> PromptLimit:
    """The prompt token limit; ValueError when the model cannot fit even a one-token prompt."""
    configured = PromptLimit(
        max_prompt_tokens, f"coordinator.max_prompt_tokens={max_prompt_tokens}"
    )
    if positions is None:
        return configured
    room = positions - max_new_tokens
    if room < 1:
        raise ValueError(
            f"coordinator.sampling.max_new_tokens={max_new_tokens} leaves no room for a prompt "
            f"in the model's {positions} positions (max_position_embeddings)"
        )
    if room >= max_prompt_tokens:
        return configured
    return PromptLimit(
        room,
        f"the model's {positions} positions less coordinator.sampling.max_new_tokens="
        f"{max_new_tokens}, under coordinator.max_prompt_tokens={max_prompt_tokens}",
    )


def empty_after_limit(
    spec: str, num_dropped: int, shortest_dropped: int | None, limit: PromptLimit
) -> str:
    """The error for a dataset whose every prompt is over the limit."""
    shortest = f"; the shortest has {shortest_dropped} tokens" if shortest_dropped else ""
    return (
        f"dataset {spec}: all {num_dropped} prompts are longer than {limit.tokens} tokens "
        f"({limit.reason}){shortest}; shorten the prompts, raise the limit, or use a model "
        "with more positions"
    )
