"""The built-in code task ``builtin:code``: write a one-line Python function from a short spec,
checked by running it against assert tests in the sandbox (the reward service's ``code``
scorer).

A prompt is a comment naming what ``f`` does, e.g. ``"# times 3 add 4\\n"``; the expected
response is the function, ``"def f(x):return x*3+4"``, then the tokenizer's EOS. The tests
call ``f`` on a fixed set of inputs (negative, zero, small, larger), so a function that is
right on some inputs and wrong on others earns part of the reward. The problems are every
(spec, constants) pair of ``SPECS``: 133 in all; ``builtin:code:test`` holds out a fixed fifth
of them, which ``builtin:code:train`` never shows.

``warmup_solution`` is what the built-in model's warm start learns from
(``builtin:tiny-code``): the right function, or with some probability one a near miss away:
a constant off by one, another operator, a missing colon (does not compile), ``y`` for ``x``
(a ``NameError``), so a sampled program fails in each of the ways the scorer names.

This module knows nothing about tokenizers, models, the sandbox or rewards; it makes rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from hybridflow.sandbox.code_tests import CodeTests

DATA_SOURCE = "code"
"""``data_source`` of every row: the reward service's code scorer."""
TEST_INPUTS = (-3, 0, 1, 2, 5, 11)
"""The inputs every problem's asserts call ``f`` on."""
HELDOUT_FRACTION = 0.2
SPLITS = ("all", "train", "test")

SPECS: tuple[tuple[str, str, range, range | None], ...] = (
    ("add {a}", "x+{a}", range(1, 10), None),
    ("sub {a}", "x-{a}", range(1, 10), None),
    ("times {a}", "x*{a}", range(2, 10), None),
    ("times {a} add {b}", "x*{a}+{b}", range(2, 10), range(1, 10)),
    ("square add {a}", "x*x+{a}", range(1, 10), None),
    ("mod {a}", "x%{a}", range(2, 10), None),
    ("max {a}", "max(x,{a})", range(1, 10), None),
    ("min {a}", "min(x,{a})", range(1, 10), None),
)
"""(spec, body, the values of ``a``, of ``b``): each filled-in pair is one problem."""


@dataclass(frozen=True)
class CodeProblem:
    """One problem: what the prompt says and the body of the right function."""

    spec: str
    body: str

    @property
    def prompt(self) -> str:
        return f"# {self.spec}\n"

    @property
    def solution(self) -> str:
        return function(self.body)

    def tests(self) -> CodeTests:
        """The asserts: ``f`` on each of ``TEST_INPUTS`` equals the right body's value."""
        values = [eval(self.body, {}, {"x": x}) for x in TEST_INPUTS]  # noqa: S307 (our own bodies)
        return CodeTests(asserts=tuple(f"assert f({x})=={v}" for x, v in zip(TEST_INPUTS, values)))


def function(body: str) -> str:
    """The response text that defines ``f`` with ``body``."""
    return f"def f(x):return {body}"


def all_problems() -> list[CodeProblem]:
    """Every problem of the task, in a fixed order."""
    problems = []
    for spec, body, values_a, values_b in SPECS:
        for a in values_a:
            for b in values_b or [None]:
                problems.append(CodeProblem(spec.format(a=a, b=b), body.format(a=a, b=b)))
    return problems


def heldout_problems() -> list[CodeProblem]:
    """The problems of the test split: a fixed (seed-independent) draw."""
    problems = all_problems()
    num = max(1, round(HELDOUT_FRACTION * len(problems)))
    return random.Random("hybridflow-code-heldout").sample(problems, num)


def split_problems(split: str) -> list[CodeProblem]:
    """The problems of ``split``: ``all``, ``train`` (all but the held-out) or ``test``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "all":
        return all_problems()
    heldout = heldout_problems()
    if split == "test":
        return sorted(heldout, key=lambda p: (p.spec, p.body))
    return [p for p in all_problems() if p not in heldout]


def make_code_rows(num: int, seed: int, split: str = "all") -> list[dict[str, Any]]:
    """``num`` verl-format rows of ``split``: ``all`` and ``train`` draw problems uniformly,
    ``test`` lists the held-out problems once each (at most ``num``). Deterministic in
    (num, seed, split); a longer list with the same seed starts with a shorter one's rows."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    problems = split_problems(split)
    if split == "test":
        chosen = problems[:num]
    else:
        rng = random.Random(f"hybridflow-code-{split}:{seed}")
        chosen = [rng.choice(problems) for _ in range(num)]
    return [
        {
            "prompt": problem.prompt,
            "data_source": DATA_SOURCE,
            "reward_model": {"ground_truth": problem.tests().to_json()},
            "extra_info": {"index": i, "solution": problem.solution},
        }
        for i, problem in enumerate(chosen)
    ]


def warmup_solution(problem: CodeProblem, correct_prob: float, rng: random.Random) -> str:
    """A warm-start target: the right function with probability ``correct_prob``, else a
    near miss (module docstring)."""
    if rng.random() < correct_prob:
        return problem.solution
    slip = rng.random()
    if slip < 0.35:
        return function(_nudge_constant(problem.body, rng))
    if slip < 0.65:
        return function(_swap_operator(problem.body, rng))
    if slip < 0.85:
        return problem.solution.replace(":", "", 1)  # def f(x)return ...: a SyntaxError
    return function(problem.body.replace("x", "y"))  # a NameError when f is called


def _nudge_constant(body: str, rng: random.Random) -> str:
    i = rng.choice([i for i, c in enumerate(body) if c.isdigit()])
    value = rng.choice([v for v in (int(body[i]) - 1, int(body[i]) + 1) if 1 <= v <= 9])
    return body[:i] + str(value) + body[i + 1 :]


def _swap_operator(body: str, rng: random.Random) -> str:
    swaps = {"+": "-", "-": "+", "*": "+", "%": "//", "max": "min", "min": "max"}
    present = [op for op in swaps if op in body]
    op = rng.choice(present)
    return body.replace(op, swaps[op], 1)
