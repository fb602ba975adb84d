"""Prompt datasets: JSONL/parquet/builtin loading, tokenisation, bad-row errors, epoch order."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hybridflow.data.datasets import (
    epoch_order,
    iter_epochs,
    load_prompt_dataset,
    read_prompt_dataset,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"
CHAT_JSONL = FIXTURES / "chat_prompts.jsonl"
STRING_JSONL = FIXTURES / "string_prompts.jsonl"

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + [chr(c) for c in range(32, 127)] + ["\n"])}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def make_tokenizer(chat_template: str | None = CHAT_TEMPLATE, add_bos_token: bool = False) -> Any:
    """A character-level tokenizer: id = position in VOCAB, "<s>" is BOS (id 1)."""
    backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=chat_template,
        add_bos_token=add_bos_token,
    )


def char_ids(text: str) -> list[int]:
    return [VOCAB[c] for c in text]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer()


def test_chat_prompts_use_the_chat_template(tokenizer: Any) -> None:
    records = load_prompt_dataset(str(CHAT_JSONL), tokenizer)
    assert [r.index for r in records] == [0, 1, 2]  # the blank line is not a row
    first = records[0]
    assert first.prompt_text == "<s><system>Be brief.\n<user>What is 2+3?\n<assistant>"
    assert first.prompt_ids.tolist() == [1] + char_ids(
        "<system>Be brief.\n<user>What is 2+3?\n<assistant>"
    )
    assert first.data_source == "openai/gsm8k"
    assert first.ground_truth == "5"
    assert first.extra_info == {"split": "train", "index": 0}
    assert records[1].ground_truth == "\\frac{1}{2}"
    assert records[2].data_source == "my_task"
    assert records[2].ground_truth is None
    assert records[2].extra_info == {}


def test_string_prompts_are_used_as_is(tokenizer: Any) -> None:
    records = load_prompt_dataset(str(STRING_JSONL), tokenizer)
    assert records[0].prompt_text == "3+4="
    assert records[0].prompt_ids.tolist() == [23, 15, 24, 33]  # ord(c) - 28, no special tokens
    assert records[1].ground_truth == "42"  # a JSON number becomes its string
    assert [r.index for r in records] == [0, 1, 2, 3]


def test_tokenizer_with_add_bos_token_gets_one_bos_on_plain_prompts() -> None:
    records = load_prompt_dataset(str(STRING_JSONL), make_tokenizer(add_bos_token=True), num=1)
    assert records[0].prompt_ids.tolist() == [1, 23, 15, 24, 33]
    chat = load_prompt_dataset(str(CHAT_JSONL), make_tokenizer(add_bos_token=True), num=1)
    assert chat[0].prompt_ids.tolist().count(1) == 1  # the template's BOS only


def test_long_prompts_are_dropped_and_counted(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = read_prompt_dataset(str(STRING_JSONL), tokenizer, max_prompt_tokens=20)
    assert [r.index for r in dataset.records] == [0, 1, 3]
    assert dataset.num_dropped_too_long == 1
    assert dataset.shortest_dropped is not None and dataset.shortest_dropped > 20
    with caplog.at_level(logging.WARNING, logger="hybridflow.data.datasets"):
        records = load_prompt_dataset(str(STRING_JSONL), tokenizer, max_prompt_tokens=20)
    assert len(records) == 3
    assert "dropped 1 prompts longer than max_prompt_tokens=20" in caplog.text


def test_num_keeps_the_first_records_after_dropping(tokenizer: Any) -> None:
    assert [r.index for r in load_prompt_dataset(str(STRING_JSONL), tokenizer, num=2)] == [0, 1]
    records = load_prompt_dataset(str(STRING_JSONL), tokenizer, num=3, max_prompt_tokens=20)
    assert [r.index for r in records] == [0, 1, 3]


def test_chat_prompt_without_chat_template_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"chat_prompts\.jsonl:1: .*no chat_template"):
        load_prompt_dataset(str(CHAT_JSONL), make_tokenizer(chat_template=None))


BAD_ROWS = [
    ({"data_source": "arith"}, "missing field 'prompt'"),
    ({"prompt": "1+1="}, "field 'data_source' must be a non-empty string, got None"),
    ({"prompt": "1+1=", "data_source": 3}, "field 'data_source' must be a non-empty string"),
    ({"prompt": 5, "data_source": "a"}, "field 'prompt' must be a string or a list of chat"),
    ({"prompt": "", "data_source": "a"}, "field 'prompt' is an empty string"),
    ({"prompt": [], "data_source": "a"}, "field 'prompt' is an empty message list"),
    ({"prompt": [{"role": "user"}], "data_source": "a"}, "field 'prompt[0].content' must be"),
    ({"prompt": ["hi"], "data_source": "a"}, "field 'prompt[0]' must be an object"),
    ({"prompt": "x", "data_source": "a", "reward_model": "7"}, "field 'reward_model' must be"),
    (
        {"prompt": "x", "data_source": "a", "reward_model": {"ground_truth": [1]}},
        "field 'reward_model.ground_truth' must be a string or number, got list",
    ),
    ({"prompt": "x", "data_source": "a", "extra_info": [1]}, "field 'extra_info' must be"),
]


@pytest.mark.parametrize(("row", "message"), BAD_ROWS)
def test_bad_jsonl_row_names_file_line_and_field(
    tmp_path: Path, tokenizer: Any, row: dict[str, Any], message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"prompt": "1+1=", "data_source": "arith"})
    path.write_text(f"{good}\n\n{json.dumps(row)}\n")
    with pytest.raises(ValueError) as excinfo:
        load_prompt_dataset(str(path), tokenizer)
    assert str(excinfo.value).startswith(f"{path}:3: ")
    assert message in str(excinfo.value)


def test_invalid_json_and_non_object_rows(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "1", "data_source": "a"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=rf"^{path}:2: invalid JSON"):
        load_prompt_dataset(str(path), tokenizer)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=rf"^{path}:1: expected an object per row, got list"):
        load_prompt_dataset(str(path), tokenizer)


def test_bad_specs(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="unknown builtin dataset"):
        load_prompt_dataset("builtin:nope", tokenizer)
    with pytest.raises(ValueError, match="no such file"):
        load_prompt_dataset(str(tmp_path / "missing.jsonl"), tokenizer)
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        load_prompt_dataset(str(csv), tokenizer)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        load_prompt_dataset(str(STRING_JSONL), tokenizer, max_prompt_tokens=0)


def test_parquet_in_verl_format(tmp_path: Path, tokenizer: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in CHAT_JSONL.read_text().splitlines()[:2]]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    records = load_prompt_dataset(str(path), tokenizer)
    from_jsonl = load_prompt_dataset(str(CHAT_JSONL), tokenizer, num=2)
    assert records == from_jsonl

    bad = rows + [dict(rows[0], data_source=None)]
    pq.write_table(pa.Table.from_pylist(bad), path)
    with pytest.raises(ValueError, match=rf"^{path} row 2: field 'data_source'"):
        load_prompt_dataset(str(path), tokenizer)


def test_parquet_without_pyarrow_says_how_to_install(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        load_prompt_dataset(str(path), tokenizer)


def test_builtin_arith(tokenizer: Any) -> None:
    from hybridflow.data import arith

    rows = arith.make_arith_rows(5, 3)
    # A tokenizer with a chat template renders each prompt as a user turn ...
    records = load_prompt_dataset("builtin:arith", tokenizer, num=5, seed=3)
    assert [r.prompt_text for r in records] == [
        f"<s><user>{row['prompt']}\n<assistant>" for row in rows
    ]
    assert [r.ground_truth for r in records] == [
        row["reward_model"]["ground_truth"] for row in rows
    ]
    assert all(r.data_source == "arith" for r in records)
    # ... and one without gets the plain prompt.
    plain = load_prompt_dataset("builtin:arith", make_tokenizer(chat_template=None), 5, seed=3)
    assert [r.prompt_text for r in plain] == [row["prompt"] for row in rows]
    assert plain[0].prompt_ids.tolist() == char_ids(rows[0]["prompt"])


def test_epoch_order_is_a_seeded_permutation() -> None:
    first = epoch_order(20, epoch=0, seed=1)
    assert sorted(first) == list(range(20))
    assert first == epoch_order(20, epoch=0, seed=1)
    assert first != epoch_order(20, epoch=1, seed=1)
    assert first != epoch_order(20, epoch=0, seed=2)
    assert epoch_order(5, epoch=3, seed=1, shuffle=False) == [0, 1, 2, 3, 4]


def test_iter_epochs_visits_every_record_once_per_epoch(tokenizer: Any) -> None:
    records = load_prompt_dataset(str(STRING_JSONL), tokenizer)
    stream = iter_epochs(records, seed=0)
    taken = [next(stream) for _ in range(8)]
    assert [epoch for epoch, _ in taken] == [0] * 4 + [1] * 4
    for epoch in (0, 1):
        indices = [r.index for e, r in taken if e == epoch]
        assert sorted(indices) == [0, 1, 2, 3]
        assert indices == [records[p].index for p in epoch_order(4, epoch, seed=0)]


def test_builtin_char_tokenizer_round_trip(tmp_path: Path) -> None:
    from hybridflow.models import tokenizer as tokenizer_module

    tokenizer = tokenizer_module.build_char_tokenizer()
    path = tmp_path / "chat.jsonl"
    path.write_text(
        json.dumps({"prompt": [{"role": "user", "content": "3+4="}], "data_source": "arith"}) + "\n"
    )
    [chat] = load_prompt_dataset(str(path), tokenizer)
    [plain] = load_prompt_dataset(str(STRING_JSONL), tokenizer, num=1)
    assert chat.prompt_text == plain.prompt_text == "3+4="
    assert (
        chat.prompt_ids.tolist()
        == plain.prompt_ids.tolist()
        == tokenizer.encode("3+4=", add_special_tokens=False)
    )
    assert len(plain.prompt_ids) == 4


class CountingTokenizer:
    """The real test tokenizer, counting what it is asked to encode."""

    def __init__(self) -> None:
        self.inner = make_tokenizer()
        self.encoded: list[str] = []
        self.chat_template = self.inner.chat_template

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.encoded.append(text)
        return list(self.inner.encode(text, add_special_tokens=add_special_tokens))


def test_an_oversized_prompt_is_refused_before_tokenising(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1=", "data_source": "arith"}, {"prompt": "x" * 5000, "data_source": "a"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = CountingTokenizer()
    with pytest.raises(ValueError, match=rf"{path}:2: prompt is 5000 bytes, over .*=4096"):
        read_prompt_dataset(str(path), tokenizer, max_prompt_bytes=4096)
    assert tokenizer.encoded == ["1+1="]  # the big row never reached the tokenizer
    # Without a limit the same file loads.
    assert len(read_prompt_dataset(str(path), tokenizer).records) == 2


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    line = json.dumps({"prompt": "y" * (3 * 1024 * 1024), "data_source": "arith"})
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=rf"{path}:1: line longer than \d+ bytes"):
        read_prompt_dataset(str(path), make_tokenizer(), max_prompt_bytes=1024)
