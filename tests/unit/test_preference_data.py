"""Preference datasets: TRL formats from JSONL and parquet, bad-row errors, built-in arith data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hybridflow.data.arith import heldout_problems, make_arith_preference_rows
from hybridflow.data.preference import (
    LabelledCompletion,
    PreferencePair,
    builtin_preference_specs,
    read_preference_dataset,
)
from tests.unit.test_datasets import VOCAB, char_ids, make_tokenizer

EOS = VOCAB["</s>"]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer()


def _write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


DPO_ROWS = [
    {"prompt": "1+2=", "chosen": "3", "rejected": "4"},
    {"prompt": "5+5=", "chosen": "10", "rejected": "9"},
]


@pytest.mark.parametrize("writer", [_write_jsonl, _write_parquet])
def test_dpo_rows_from_jsonl_and_parquet(tmp_path: Path, tokenizer: Any, writer: Any) -> None:
    suffix = ".jsonl" if writer is _write_jsonl else ".parquet"
    records = read_preference_dataset(writer(tmp_path / f"d{suffix}", DPO_ROWS), tokenizer, "dpo")
    assert [type(r) for r in records] == [PreferencePair, PreferencePair]
    second = records[1]
    assert second.prompt_ids.tolist() == char_ids("5+5=")
    # Plain-string completions get the tokenizer's EOS, as TRL appends it.
    assert second.chosen_ids.tolist() == [*char_ids("10"), EOS]
    assert second.rejected_ids.tolist() == [*char_ids("9"), EOS]
    assert second.index == 1


def test_kto_and_sft_rows(tmp_path: Path, tokenizer: Any) -> None:
    kto = _write_jsonl(
        tmp_path / "k.jsonl",
        [
            {"prompt": "1+1=", "completion": "2", "label": True},
            {"prompt": "1+1=", "completion": "3", "label": False},
        ],
    )
    records = read_preference_dataset(kto, tokenizer, "kto")
    assert [r.label for r in records] == [True, False]
    assert records[1].completion_ids.tolist() == [*char_ids("3"), EOS]
    # SFT reads `response`, or `completion` when there is no `response`.
    sft = _write_parquet(
        tmp_path / "s.parquet",
        [{"prompt": "2+2=", "completion": "4"}, {"prompt": "2+3=", "completion": "5"}],
    )
    sft_records = read_preference_dataset(sft, tokenizer, "sft")
    assert all(isinstance(r, LabelledCompletion) and r.label for r in sft_records)
    assert sft_records[0].completion_ids.tolist() == [*char_ids("4"), EOS]


def test_conversational_rows_render_the_completion_after_the_prompt(
    tmp_path: Path, tokenizer: Any
) -> None:
    row = {
        "prompt": [{"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "yo"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    (record,) = read_preference_dataset(_write_jsonl(tmp_path / "c.jsonl", [row]), tokenizer, "dpo")
    assert record.prompt_ids.tolist() == [VOCAB["<s>"], *char_ids("<user>hi\n<assistant>")]
    # The template ends each turn with a newline; no EOS is added to chat completions.
    assert record.chosen_ids.tolist() == char_ids("yo\n")
    assert record.rejected_ids.tolist() == char_ids("no\n")


@pytest.mark.parametrize(
    ("kind", "row", "message"),
    [
        ("dpo", {"prompt": "1+1=", "chosen": "2"}, "missing field 'rejected'"),
        ("dpo", {"chosen": "2", "rejected": "3"}, "missing field 'prompt'"),
        ("dpo", {"prompt": "1+1=", "chosen": "", "rejected": "3"}, "field 'chosen' is an empty"),
        ("dpo", {"prompt": 5, "chosen": "2", "rejected": "3"}, "field 'prompt' must be"),
        ("kto", {"prompt": "1+1=", "completion": "2", "label": "yes"}, "field 'label' must be"),
        ("kto", {"prompt": "1+1=", "completion": 2, "label": True}, "field 'completion' must"),
        ("sft", {"prompt": "1+1="}, "missing field 'response'"),
        (
            "dpo",
            {"prompt": "1+1=", "chosen": [{"role": "assistant"}], "rejected": "3"},
            r"field 'chosen\[0\]' must be a message",
        ),
    ],
)
def test_bad_rows_name_file_row_and_field(
    tmp_path: Path, tokenizer: Any, kind: str, row: dict[str, Any], message: str
) -> None:
    good = {
        "dpo": {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        "kto": {"prompt": "1+1=", "completion": "2", "label": True},
        "sft": {"prompt": "1+1=", "response": "2"},
    }[kind]
    path = _write_jsonl(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(ValueError, match=f"bad.jsonl:2: {message}"):
        read_preference_dataset(path, tokenizer, kind)


def test_bad_parquet_row_names_file_row_and_field(tmp_path: Path, tokenizer: Any) -> None:
    rows = [DPO_ROWS[0], {"prompt": "1+1=", "chosen": "2", "rejected": None}]
    path = _write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ValueError, match="bad.parquet row 1: missing field 'rejected'"):
        read_preference_dataset(path, tokenizer, "dpo")


def test_unknown_builtin_and_kind_mismatch_are_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="unknown builtin preference dataset"):
        read_preference_dataset("builtin:arith_orpo", tokenizer, "dpo")
    with pytest.raises(ValueError, match="holds kto rows, not dpo"):
        read_preference_dataset("builtin:arith_kto", tokenizer, "dpo")
    with pytest.raises(ValueError, match="no such file.*builtin:arith_dpo"):
        read_preference_dataset("/nonexistent/pairs.jsonl", tokenizer, "dpo")
    with pytest.raises(ValueError, match="kind must be one of"):
        read_preference_dataset("builtin:arith_dpo", tokenizer, "orpo")


@pytest.mark.parametrize("kind", ["dpo", "kto", "sft"])
def test_builtin_rows_are_deterministic_correct_and_held_out(kind: str) -> None:
    rows = make_arith_preference_rows(kind, 64, seed=3)
    assert rows == make_arith_preference_rows(kind, 64, seed=3)
    assert rows != make_arith_preference_rows(kind, 64, seed=4)
    test_rows = make_arith_preference_rows(kind, 64, seed=3, split="test")
    heldout = {f"{a}+{b}=" for a, b in heldout_problems()}
    assert len(heldout) == 20
    assert all(r["prompt"] in heldout for r in test_rows)
    assert not any(r["prompt"] in heldout for r in rows)
    for r in rows + test_rows:
        a, b = (int(x) for x in r["prompt"][:-1].split("+"))
        if kind == "dpo":
            assert r["chosen"] == str(a + b)
            assert r["rejected"] != r["chosen"] and 1 <= abs(int(r["rejected"]) - a - b) <= 3
        elif kind == "kto":
            assert (r["completion"] == str(a + b)) == r["label"]
        else:
            assert r["response"] == str(a + b)
    if kind == "kto":
        assert {r["label"] for r in rows} == {True, False}


def test_builtin_specs_read_through_the_tokenizer(tokenizer: Any) -> None:
    assert "builtin:arith_dpo:test" in builtin_preference_specs()
    pairs = read_preference_dataset("builtin:arith_dpo:test", tokenizer, "dpo", num=5, seed=1)
    assert len(pairs) == 5
    first = make_arith_preference_rows("dpo", 5, seed=1, split="test")[0]
    assert pairs[0].chosen_ids.tolist() == [*char_ids(first["chosen"]), EOS]
    assert len(read_preference_dataset("builtin:arith_sft", tokenizer, "sft")) == 512
