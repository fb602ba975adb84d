"""What each built-in model exists for, measured, and the floor a build must reach to be saved.

- ``tiny`` (the warm start): on every ``builtin:arith`` problem, the greedy answer is the true
  sum (``greedy_accuracy``), and the probability of sampling exactly the true sum then EOS at
  temperature 1 (``sampled_accuracy``, computed, not sampled) stays near the warm start's
  ``label_correct_prob``: sure of the format, unsure of the digits, so RL has room to learn.
- ``tiny-rm`` (the reward model): on the held-out problems it never trained on, the right sum
  scores above each wrong response (``heldout_pair_accuracy``, over near misses, other
  numbers and garbage), and above the off-by-one answers by a clear margin.
- ``tiny-qwen3``: the same as ``tiny``, its prompts rendered through its ChatML template.
- ``tiny-tools``: real episodes of ``builtin:calc`` and ``builtin:guess`` at temperature 1
  (``tools_quality.py``): it calls the calculator in some episodes but not all, its calls are
  well formed, it copies a result it got, it cannot do the arithmetic without the tool, and it
  wins most games, in more turns than binary search needs: room for RL on every count.
- ``tiny-code``: on every ``builtin:code`` problem, the greedy function is the right one
  (``greedy_exact``) and compiles (``greedy_compiles``: Python's ``compile``, nothing run), and
  the probability of sampling exactly the right function then EOS at temperature 1
  (``sampled_exact``, computed) stays near its warm start's ``label_correct_prob``.
- ``tiny-random`` is a seeded random initialisation; it promises nothing but its bytes.

``measure(name, path)`` returns the numbers; ``shortfalls(name, numbers)`` names every gate
they miss. The shipped weights carry their numbers in the manifest (``models/builtin.py``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from hybridflow.builtins_build.tools_quality import TOLERANCE as SAMPLED_TOLERANCE
from hybridflow.data.arith import (
    DEFAULT_MAX_OPERAND,
    arith_ground_truth,
    arith_prompt,
    heldout_problems,
)

if TYPE_CHECKING:
    import torch

GATES: dict[str, dict[str, tuple[float, float]]] = {
    "tiny": {
        "greedy_accuracy": (0.85, 1.0),
        "greedy_format": (1.0, 1.0),
        "sampled_accuracy": (0.25, 0.65),
    },
    "tiny-rm": {"heldout_pair_accuracy": (0.95, 1.0), "heldout_near_margin": (2.0, float("inf"))},
    "tiny-random": {},
    "tiny-qwen3": {
        "greedy_accuracy": (0.85, 1.0),
        "greedy_format": (1.0, 1.0),
        "sampled_accuracy": (0.25, 0.65),
    },
    "tiny-code": {
        "greedy_exact": (0.85, 1.0),
        "greedy_compiles": (0.95, 1.0),
        "sampled_exact": (0.2, 0.65),
    },
    "tiny-tools": {
        "calc_tool_rate": (0.25, 0.7),
        "calc_call_ok": (0.7, 1.0),
        "calc_copy_ok": (0.8, 1.0),
        "calc_success": (0.15, 0.7),
        "calc_no_tool_success": (0.0, 0.15),
        "guess_success": (0.5, 1.0),
        "guess_turns_per_success": (5.0, 8.0),
    },
}
"""Each built-in's measures and the closed range ``(low, high)`` each must fall in."""

TOLERANCE = {"tiny-tools": SAMPLED_TOLERANCE}
"""How far a measure taken on another CPU may be from the one recorded at build time, where
that is more than ``DEFAULT_TOLERANCE`` (the tiny-tools measures are sampled episodes)."""
DEFAULT_TOLERANCE = 0.011
"""Float noise of a computed measure: at most a near-tie flipping one problem's greedy answer
or one pair's order."""

EVAL_SEED = "builtin-quality"
"""Seed of the wrong responses the reward model is measured on (not a training seed)."""

WRONG_PER_PROBLEM = 8
"""Random wrong responses per held-out problem, besides the two off-by-one answers."""


def measure(name: str, path: Path) -> dict[str, float]:
    """The quality numbers of the built-in ``name`` saved at ``path`` (deterministic)."""
    if name not in GATES:
        raise ValueError(f"no quality gates for builtin {name!r}; known: {sorted(GATES)}")
    if name == "tiny-rm":
        return _reward_model_numbers(path)
    if name == "tiny-tools":
        from hybridflow.builtins_build.tools_quality import tools_numbers

        return tools_numbers(path)
    if not GATES[name]:
        return {}
    if name == "tiny-code":
        return _code_numbers(path)
    return _policy_numbers(path)


def shortfalls(name: str, numbers: dict[str, float]) -> list[str]:
    """One line per gate of ``name`` that ``numbers`` misses (empty: the model passes)."""
    lines = []
    for key, (low, high) in GATES[name].items():
        value = numbers.get(key)
        if value is None:
            lines.append(f"{key} was not measured")
        elif not low <= value <= high:
            lines.append(f"{key} {value:.3f} outside [{low}, {high}]")
    return lines


def _policy_numbers(path: Path) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.builtins_build.policy import render_prompt

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    eos = int(tok.eos_token_id)
    grid = [(a, b) for a in range(DEFAULT_MAX_OPERAND + 1) for b in range(DEFAULT_MAX_OPERAND + 1)]
    greedy_right = greedy_formed = 0
    sampled = 0.0
    with torch.no_grad():
        for a, b in grid:
            prompt = tok.encode(render_prompt(tok, arith_prompt(a, b)), add_special_tokens=False)
            answer = tok.encode(arith_ground_truth(a, b), add_special_tokens=False) + [eos]
            logp = _log_probs(model, prompt + answer)[len(prompt) - 1 : -1]
            sampled += float(logp.gather(-1, torch.tensor(answer).unsqueeze(-1)).sum().exp())
            greedy = _greedy(model, prompt, eos, max_new=len(answer) + 2)
            text = str(tok.decode(greedy[:-1])) if greedy[-1:] == [eos] else ""
            greedy_formed += text.isdigit()
            greedy_right += greedy == answer
    n = len(grid)
    return {
        "greedy_accuracy": greedy_right / n,
        "greedy_format": greedy_formed / n,
        "sampled_accuracy": sampled / n,
    }


def _code_numbers(path: Path) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.data.code_task import all_problems

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    eos = int(tok.eos_token_id)
    problems = all_problems()
    exact = compiles = 0
    sampled = 0.0
    with torch.no_grad():
        for problem in problems:
            prompt = tok.encode(problem.prompt, add_special_tokens=False)
            answer = tok.encode(problem.solution, add_special_tokens=False) + [eos]
            logp = _log_probs(model, prompt + answer)[len(prompt) - 1 : -1]
            sampled += float(logp.gather(-1, torch.tensor(answer).unsqueeze(-1)).sum().exp())
            greedy = _greedy(model, prompt, eos, max_new=len(answer) + 8)
            exact += greedy == answer
            compiles += _compiles(str(tok.decode(greedy[:-1] if greedy[-1:] == [eos] else greedy)))
    n = len(problems)
    return {
        "greedy_exact": exact / n,
        "greedy_compiles": compiles / n,
        "sampled_exact": sampled / n,
    }


def _compiles(source: str) -> bool:
    try:
        compile(source, "<greedy>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def _log_probs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    import torch

    logits = model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def _greedy(model: torch.nn.Module, prompt: list[int], eos: int, max_new: int) -> list[int]:
    ids = list(prompt)
    for _ in range(max_new):
        ids.append(int(_log_probs(model, ids)[-1].argmax()))
        if ids[-1] == eos:
            break
    return ids[len(prompt) :]


def _reward_model_numbers(path: Path) -> dict[str, float]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from hybridflow.builtins_build.reward_model import wrong_response

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)

    def score(a: int, b: int, response: str) -> float:
        ids = tok.encode(arith_prompt(a, b) + response, add_special_tokens=False)
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([ids])).logits[0, 0])

    rng = random.Random(EVAL_SEED)
    wins = pairs = 0
    margins = []
    for a, b in sorted(heldout_problems(DEFAULT_MAX_OPERAND)):
        right = score(a, b, arith_ground_truth(a, b))
        near = [str(a + b + 1)] + ([str(a + b - 1)] if a + b > 0 else [])
        wrong = near + [wrong_response(a, b, rng) for _ in range(WRONG_PER_PROBLEM)]
        wrong_scores = [score(a, b, w) for w in wrong]
        wins += sum(right > s for s in wrong_scores)
        pairs += len(wrong_scores)
        margins += [right - s for s in wrong_scores[: len(near)]]
    return {
        "heldout_pair_accuracy": wins / pairs,
        "heldout_near_margin": sum(margins) / len(margins),
    }
