"""The built-in arithmetic task rows."""

import pytest

from hybridflow.data.arith import arith_ground_truth, arith_prompt, make_arith_rows


def test_rows_have_verl_format_and_correct_sums() -> None:
    rows = make_arith_rows(50, seed=3, max_operand=9)
    assert len(rows) == 50
    for i, row in enumerate(rows):
        assert set(row) == {"prompt", "data_source", "reward_model", "extra_info"}
        assert row["data_source"] == "arith"
        assert row["extra_info"] == {"index": i}
        a, b = row["prompt"].removesuffix("=").split("+")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        assert row["prompt"] == f"{int(a)}+{int(b)}="
        assert row["reward_model"] == {"ground_truth": str(int(a) + int(b))}


def test_rows_are_deterministic_in_seed_and_prefix_stable() -> None:
    assert make_arith_rows(20, seed=7) == make_arith_rows(20, seed=7)
    assert make_arith_rows(20, seed=7) != make_arith_rows(20, seed=8)
    assert make_arith_rows(30, seed=7)[:20] == make_arith_rows(20, seed=7)


def test_max_operand_bounds_operands_and_covers_range() -> None:
    rows = make_arith_rows(400, seed=0, max_operand=2)
    operands = {int(x) for r in rows for x in r["prompt"].removesuffix("=").split("+")}
    assert operands == {0, 1, 2}


def test_helpers() -> None:
    assert arith_prompt(3, 4) == "3+4="
    assert arith_ground_truth(3, 4) == "7"
    assert arith_ground_truth(9, 9) == "18"


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="num"):
        make_arith_rows(-1, seed=0)
    with pytest.raises(ValueError, match="max_operand"):
        make_arith_rows(3, seed=0, max_operand=-2)
