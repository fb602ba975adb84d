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
    num: int, seed: int, max_operand: int = DEFAULT_MAX_OPERAND, split: str = "all"
) -> list[dict[str, Any]]:
    """``num`` verl-format rows of ``split``'s problems: ``all`` and ``train`` draw operands
    uniformly (``train`` never a held-out problem: ``heldout_problems``), ``test`` lists the
    held-out problems once each, in a fixed order (at most ``num`` of them).

    Deterministic in (num, seed, max_operand, split); a longer list with the same seed starts
    with the rows of a shorter one.
    """
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if split not in ("all", "train", "test"):
        raise ValueError(f"split must be 'all', 'train' or 'test', got {split!r}")
    if split == "all":
        rng = random.Random(seed)
        problems = [(rng.randint(0, max_operand), rng.randint(0, max_operand)) for _ in range(num)]
    else:
        heldout = heldout_problems(max_operand)
        if split == "test":
            problems = sorted(heldout)[:num]
        else:
            grid = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
            train = [p for p in grid if p not in heldout]
            rng = random.Random(f"hybridflow-arith-train:{seed}")
            problems = [rng.choice(train) for _ in range(num)]
    return [
        {
            "prompt": arith_prompt(a, b),
            "data_source": DATA_SOURCE,
            "reward_model": {"ground_truth": arith_ground_truth(a, b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate(problems)
    ]


# ---------------------------------------------------------------- preference data
PREFERENCE_KINDS = ("dpo", "kto", "sft")
"""Built-in preference datasets: ``builtin:arith_<kind>`` (train) and ``...:test`` (held out)."""

HELDOUT_FRACTION = 0.2
"""Share of the (a, b) problems kept for the test split (never in train, for every seed)."""

WRONG_MAX_OFFSET = 3
"""Wrong answers are near misses: the sum plus or minus 1..WRONG_MAX_OFFSET, never negative."""


def heldout_problems(max_operand: int = DEFAULT_MAX_OPERAND) -> set[tuple[int, int]]:
    """The (a, b) problems of the test split: a fixed (seed-independent) draw of the grid."""
    grid = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    num = max(1, round(HELDOUT_FRACTION * len(grid)))
    return set(random.Random("hybridflow-arith-heldout").sample(grid, num))


def wrong_answer(a: int, b: int, rng: random.Random) -> str:
    """A near miss of ``a + b``: off by 1..WRONG_MAX_OFFSET, never negative."""
    answer = a + b
    offsets = [d for d in range(-WRONG_MAX_OFFSET, WRONG_MAX_OFFSET + 1) if d and answer + d >= 0]
    return str(answer + rng.choice(offsets))


def make_arith_preference_rows(
    kind: str,
    num: int,
    seed: int,
    split: str = "train",
    max_operand: int = DEFAULT_MAX_OPERAND,
) -> list[dict[str, Any]]:
    """``num`` TRL-format rows of ``kind`` for the arith task, deterministic in the arguments.

    dpo: ``prompt``, ``chosen`` (the sum), ``rejected`` (a near miss); kto: ``prompt``,
    ``completion``, ``label`` (True for the sum, False for a near miss, drawn 50/50); sft:
    ``prompt``, ``response`` (the sum). Problems come from the train or the test split (see
    ``heldout_problems``), drawn uniformly with replacement.
    """
    if kind not in PREFERENCE_KINDS:
        raise ValueError(f"kind must be one of {PREFERENCE_KINDS}, got {kind!r}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1 for a train/test split, got {max_operand}")
    heldout = heldout_problems(max_operand)
    grid = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    problems = [p for p in grid if (p in heldout) == (split == "test")]
    rng = random.Random(f"hybridflow-arith-{kind}:{split}:{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(num):
        a, b = rng.choice(problems)
        prompt, right, wrong = arith_prompt(a, b), arith_ground_truth(a, b), wrong_answer(a, b, rng)
        if kind == "dpo":
            rows.append({"prompt": prompt, "chosen": right, "rejected": wrong})
        elif kind == "kto":
            label = rng.random() < 0.5
            rows.append({"prompt": prompt, "completion": right if label else wrong, "label": label})
        else:
            rows.append({"prompt": prompt, "response": right})
    return rows
