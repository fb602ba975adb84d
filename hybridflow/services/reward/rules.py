"""Rule scorers: answer extraction and comparison for arithmetic, gsm8k and MATH-style tasks.

Pure string functions in the style of verl's ``utils/reward_score`` (gsm8k ``#### n``, the
Hendrycks MATH ``\\boxed{}`` normalisation, trimmed to the common cases), plus a form-only
stand-in for free-form prompts without a ground truth. They know nothing of
batches, registries, threads or the wire; an invalid ground truth raises ValueError and the
caller turns that into a per-item error.
"""

from __future__ import annotations

import re
from fractions import Fraction

_INT_RE = re.compile(r"[+-]?\d+")
_GSM8K_STRICT_RE = re.compile(r"####\s*\$?\s*(-?[0-9.,]+)")
_GSM8K_FLEXIBLE_RE = re.compile(r"-?[0-9.,]+")
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")
_NUMBER_RE = re.compile(r"-?(\d+(\.\d*)?|\.\d+)")
_FRAC_RE = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}")
_SLASH_RE = re.compile(r"(-?\d+)/(\d+)")


def score_arith(response: str, ground_truth: str, format_score: float = 0.0) -> float:
    """1.0 when the stripped response is exactly the ground-truth integer.

    A response that is an integer but the wrong one scores ``format_score``; anything else 0.
    """
    expected = ground_truth.strip()
    if not _INT_RE.fullmatch(expected):
        raise ValueError(f"arith ground truth must be an integer, got {ground_truth!r}")
    answer = response.strip()
    if answer == str(int(expected)):
        return 1.0
    return format_score if _INT_RE.fullmatch(answer) else 0.0


def extract_gsm8k_answer(response: str, method: str = "strict") -> str | None:
    """The final answer of a gsm8k response, with commas and ``$`` removed; None if absent.

    "strict": the number after the last ``####``; "flexible": the last number in the text.
    """
    if method == "strict":
        matches = _GSM8K_STRICT_RE.findall(response)
    elif method == "flexible":
        matches = _GSM8K_FLEXIBLE_RE.findall(response)
    else:
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    for candidate in reversed(matches):
        cleaned = candidate.replace(",", "").replace("$", "").rstrip(".")
        if any(ch.isdigit() for ch in cleaned):
            return cleaned
    return None


def score_gsm8k(
    response: str, ground_truth: str, method: str = "strict", format_score: float = 0.0
) -> float:
    """1.0 when the extracted answer equals the ground truth (as numbers when both are)."""
    answer = extract_gsm8k_answer(response, method)
    if answer is None:
        return 0.0
    expected = ground_truth.strip().replace(",", "").replace("$", "").rstrip(".")
    if not expected:
        raise ValueError("gsm8k ground truth is empty")
    return 1.0 if _answers_equal(answer, expected) else format_score


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent.

    Also accepts the brace-less ``\\boxed 5`` form (content runs to the next ``$`` or end).
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    pos = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if text.startswith(" ", pos):
        rest = text[pos:].lstrip(" ")
        return rest.split("$")[0].strip() or None
    if not text.startswith("{", pos):
        return None
    depth = 0
    for end in range(pos, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1 : end]
    return None  # unbalanced braces: no well-formed answer


def normalize_math_answer(answer: str) -> str:
    """Canonical form of a MATH answer: removes spacing, ``\\left``/``\\right``, ``$``, ``%``,
    degree marks, ``\\text{}`` wrappers, a short ``x =`` prefix and a trailing ``.``;
    ``dfrac``/``tfrac`` → ``frac``, ``\\frac12`` → ``\\frac{1}{2}``, ``1,000`` → ``1000``."""
    s = answer.strip().replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    for degree in ("^{\\circ}", "^\\circ"):
        s = s.replace(degree, "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    for spacing in ("\\,", "\\;", "\\:", "\\ ", "~"):
        s = s.replace(spacing, "")
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = s.replace(" ", "").rstrip(".")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    if s.startswith("."):
        s = "0" + s
    return s


def score_math(response: str, ground_truth: str, format_score: float = 0.0) -> float:
    """1.0 when the last ``\\boxed{}`` of the response matches the ground truth after
    normalisation (numbers compared exactly as fractions). A ground truth that itself holds a
    ``\\boxed{}`` is reduced to its content first."""
    boxed = last_boxed_content(response)
    if boxed is None:
        return 0.0
    expected = last_boxed_content(ground_truth) or ground_truth
    expected_norm = normalize_math_answer(expected)
    if not expected_norm:
        raise ValueError(f"math ground truth is empty after normalisation: {ground_truth!r}")
    return 1.0 if _answers_equal(normalize_math_answer(boxed), expected_norm) else format_score


def score_plain_text(response: str) -> float:
    """Share of the stripped response's characters that are letters or whitespace (0.0 when
    empty): "looks like prose, not digits or symbols".

    A stand-in for free-form prompts (ShareGPT) that have no ground truth while no reward
    model is served: it checks the form of an answer, never its content or quality.
    """
    text = response.strip()
    if not text:
        return 0.0
    return sum(ch.isalpha() or ch.isspace() for ch in text) / len(text)


def _as_number(text: str) -> Fraction | None:
    """Exact value of an integer, decimal, ``a/b`` or ``\\frac{a}{b}``; None otherwise."""
    if _NUMBER_RE.fullmatch(text):
        return Fraction(text)
    frac = _FRAC_RE.fullmatch(text)
    if frac:
        sign, num, den = frac.groups()
        if int(den) != 0:
            return Fraction(int(num), int(den)) * (-1 if sign else 1)
    slash = _SLASH_RE.fullmatch(text)
    if slash and int(slash.group(2)) != 0:
        return Fraction(int(slash.group(1)), int(slash.group(2)))
    return None


def _answers_equal(answer: str, expected: str) -> bool:
    if answer == expected:
        return True
    answer_value, expected_value = _as_number(answer), _as_number(expected)
    return answer_value is not None and answer_value == expected_value
