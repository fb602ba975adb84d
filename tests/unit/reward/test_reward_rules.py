"""Rule scorers against hand-written cases (verl's gsm8k and MATH conventions)."""

from __future__ import annotations

import pytest

from hybridflow.services.reward.rules import (
    extract_gsm8k_answer,
    last_boxed_content,
    normalize_math_answer,
    score_arith,
    score_gsm8k,
    score_math,
)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("7", "7", 1.0),
        (" 7\n", "7", 1.0),
        ("7", " 7 ", 1.0),
        ("-3", "-3", 1.0),
        ("8", "7", 0.0),
        ("07", "7", 0.0),
        ("7 apples", "7", 0.0),
        ("", "7", 0.0),
    ],
)
def test_arith_exact_match(response: str, truth: str, expected: float) -> None:
    assert score_arith(response, truth) == expected


def test_arith_format_score_only_for_wrong_integers() -> None:
    assert score_arith("8", "7", format_score=0.1) == 0.1
    assert score_arith("eight", "7", format_score=0.1) == 0.0


def test_arith_rejects_non_integer_ground_truth() -> None:
    with pytest.raises(ValueError, match="arith ground truth must be an integer"):
        score_arith("7", "seven")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The answer is #### 1,234", "1234"),
        ("#### 72", "72"),
        ("####72", "72"),
        ("#### $1,000", "1000"),
        ("#### -5", "-5"),
        ("#### 3.5", "3.5"),
        ("#### 72.", "72"),
        ("first #### 1 then #### 2", "2"),
        ("no marker 42", None),
        ("#### ", None),
    ],
)
def test_gsm8k_strict_extraction(response: str, expected: str | None) -> None:
    assert extract_gsm8k_answer(response, "strict") == expected


def test_gsm8k_flexible_extraction_takes_last_number() -> None:
    assert extract_gsm8k_answer("so 3 + 4 gives 7.", "flexible") == "7"
    assert extract_gsm8k_answer("total 1,234 dollars", "flexible") == "1234"
    assert extract_gsm8k_answer("nothing here.", "flexible") is None


def test_gsm8k_scores() -> None:
    assert score_gsm8k("The answer is #### 1,234", "1234") == 1.0
    assert score_gsm8k("#### 1234", "1,234") == 1.0
    assert score_gsm8k("#### 18.00", "18") == 1.0  # compared as numbers
    assert score_gsm8k("#### 17", "18") == 0.0
    assert score_gsm8k("#### 17", "18", format_score=0.1) == 0.1
    assert score_gsm8k("18", "18") == 0.0  # strict needs ####
    assert score_gsm8k("18", "18", method="flexible") == 1.0
    with pytest.raises(ValueError, match="method"):
        score_gsm8k("#### 1", "1", method="loose")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{x^{2}}}", "\\sqrt{x^{2}}"),
        ("$\\boxed 7$", "7"),
        ("\\fbox{9}", "9"),
        ("\\boxed{unbalanced", None),
        ("no box", None),
    ],
)
def test_last_boxed_content(text: str, expected: str | None) -> None:
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (" \\left( 1, 2 \\right) ", "(1,2)"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("x = 5", "5"),
        ("5.", "5"),
        ("90^\\circ", "90"),
        ("50\\%", "50"),
        ("\\$1,000", "1000"),
        ("\\text{(A)}", "(A)"),
        (".5", "0.5"),
        ("\\sqrt2", "\\sqrt{2}"),
    ],
)
def test_normalize_math_answer(raw: str, expected: str) -> None:
    assert normalize_math_answer(raw) == expected


def test_math_scores() -> None:
    assert score_math("Thus \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}") == 1.0
    assert score_math("\\boxed{0.5}", "\\frac{1}{2}") == 1.0  # equal as numbers
    assert score_math("\\boxed{\\left(3, 4\\right)}", "(3,4)") == 1.0
    assert score_math("\\boxed{x = 10.}", "10") == 1.0
    assert score_math("\\boxed{5}", "the answer is \\boxed{5}") == 1.0
    assert score_math("\\boxed{6}", "5") == 0.0
    assert score_math("\\boxed{6}", "5", format_score=0.1) == 0.1
    assert score_math("5", "5", format_score=0.1) == 0.0  # no box: no answer
