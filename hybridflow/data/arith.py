"""The built-in ``builtin:arith`` task: seeded "a+b=" prompts with an exact-match answer.

Rows follow verl's dataset format (``prompt``, ``data_source``, ``reward_model.ground_truth``,
``extra_info``); the prompt is a plain string that is tokenized as-is, with no chat template.
The expected response is the decimal sum followed by the tokenizer's EOS.

This module knows nothing about tokenizers, models or rewards; it only produces rows.
"""

from __future__ import annotations

import random
from typing import Any

DATA_SOURCE = "arith"
"""``data_source`` of every row; the reward service picks its exact-match scorer by it."""

DEFAULT_MAX_OPERAND = 9
"""Operands are drawn uniformly from 0..max_operand (both ends included)."""


def arith_prompt(a: int, b: int) -> str:
    """The prompt text for ``a + b``, e.g. ``"3+4="``."""
    return f"{a}+{b}="


def arith_ground_truth(a: int, b: int) -> str:
    """The exact response text expected for ``a + b`` (no EOS), e.g. ``"7"``."""
    return str(a + b)


def make_arith_rows(
    num: int, seed: int, max_operand: int = DEFAULT_MAX_OPERAND
) -> list[dict[str, Any]]:
    """``num`` verl-format rows with operands drawn uniformly from 0..max_operand.

    Deterministic in (num, seed, max_operand); a longer list with the same seed starts with the
    rows of a shorter one.
    """
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(num):
        a = rng.randint(0, max_operand)
        b = rng.randint(0, max_operand)
        rows.append(
            {
                "prompt": arith_prompt(a, b),
                "data_source": DATA_SOURCE,
                "reward_model": {"ground_truth": arith_ground_truth(a, b)},
                "extra_info": {"index": i},
            }
        )
    return rows
