"""ShareGPT conversations as prompts (``sharegpt:PATH``) and their stand-in scorer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hybridflow.data.datasets import check_prompt_rows, load_prompt_dataset
from hybridflow.services.reward.registry import ScorerRegistry
from hybridflow.services.reward.rules import score_plain_text
from hybridflow.services.reward.scorers import score_batch
from hybridflow.types import ScoreItem, ScoreResult
from tests.unit.test_datasets import char_ids, make_tokenizer

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "benchmarks" / "data" / "sharegpt_sample.json"

CONVERSATIONS: list[dict[str, Any]] = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."},
        {"from": "human", "value": "Later turn"}]},
    {"conversations": [{"from": "system", "value": "Be kind."}, {"from": "user", "value": "Go"}]},
]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer()


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_first_human_turn_is_the_chat_prompt(tmp_path: Path, tokenizer: Any, suffix: str) -> None:
    path = tmp_path / f"chats{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(CONVERSATIONS))
    else:
        write_jsonl(path, CONVERSATIONS)
    first, second = load_prompt_dataset(f"sharegpt:{path}", tokenizer)
    # The test tokenizer's template: BOS, "<role>content\n" per message, "<assistant>".
    assert first.prompt_text == "<s><user>Hi?\n<assistant>"
    assert first.prompt_ids.tolist() == [1] + char_ids("<user>Hi?\n<assistant>")
    assert (first.data_source, first.ground_truth, first.extra_info) == (
        "sharegpt",
        None,
        {"id": "a"},
    )
    assert second.prompt_text == "<s><user>Go\n<assistant>"  # the system turn is skipped
    assert second.extra_info == {} and second.index == 1


def test_bad_conversations_name_the_row_and_field(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([
        {"conversations": [{"from": "gpt", "value": "only a reply"}]},
        {"conversations": [{"from": "human", "value": " "}]},
        {"turns": []},
        "text",
    ]))  # fmt: skip
    with pytest.raises(ValueError, match=rf"^{path} conversation 0: .*has no human turn"):
        load_prompt_dataset(f"sharegpt:{path}", tokenizer)
    assert check_prompt_rows(f"sharegpt:{path}") == [
        f"{path} conversation 0: field 'conversations' has no human turn (from: human or user)",
        f"{path} conversation 1: field 'conversations[0].value' must be a non-empty string",
        f"{path} conversation 2: field 'conversations' must be a list of turns, got None",
        f"{path} conversation 3: expected an object per conversation, got str",
    ]
    path.write_text('{"conversations": []}')
    with pytest.raises(ValueError, match="expected a JSON list of conversations, got dict"):
        load_prompt_dataset(f"sharegpt:{path}", tokenizer)
    with pytest.raises(ValueError, match="no such file"):
        load_prompt_dataset(f"sharegpt:{tmp_path / 'missing.json'}", tokenizer)


def test_shipped_sample_loads_and_the_reward_service_can_score_it(tokenizer: Any) -> None:
    records = load_prompt_dataset(f"sharegpt:{SAMPLE}", tokenizer, max_prompt_tokens=64)
    assert len(records) == 64  # none dropped at the seed mapping's 64 prompt tokens
    assert records[0].extra_info == {"id": "sample-00"}
    registry = ScorerRegistry()

    def needs_ground_truth(data_source: str) -> bool | None:
        scorer = registry.resolve(data_source)
        return None if scorer is None else scorer.requires_ground_truth

    assert check_prompt_rows(f"sharegpt:{SAMPLE}", needs_ground_truth=needs_ground_truth) == []


def test_plain_text_stand_in_scores_the_share_of_letters_and_spaces() -> None:
    assert score_plain_text("Hello there") == 1.0
    assert score_plain_text(" ab12 ") == 0.5  # stripped: 2 of "ab12"
    assert score_plain_text("a b!") == 0.75
    assert score_plain_text("   ") == 0.0 and score_plain_text("42") == 0.0
    items = [ScoreItem("sharegpt", "Spring rain", None), ScoreItem("sharegpt", "7", None)]
    assert score_batch(items) == [ScoreResult(1.0), ScoreResult(0.0)]
