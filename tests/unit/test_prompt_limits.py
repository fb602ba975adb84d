"""The prompt token limit: the configured one, bounded by the model's positions less the
response; a dataset the limit empties is an error naming the limit and the shortest prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.data.prompt_limits import empty_after_limit, model_positions, prompt_limit


def _model(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_positions_come_from_the_text_config_first(tmp_path: Path) -> None:
    assert model_positions(_model(tmp_path, {"max_position_embeddings": 128})) == 128
    nested = {"max_position_embeddings": 9, "text_config": {"max_position_embeddings": 4096}}
    assert model_positions(_model(tmp_path, nested)) == 4096
    assert model_positions(_model(tmp_path, {"n_positions": 1024})) == 1024
    assert model_positions(_model(tmp_path, {"hidden_size": 8})) is None
    assert model_positions(tmp_path / "missing") is None


def test_the_configured_limit_stands_when_the_model_has_room() -> None:
    limit = prompt_limit(512, 64, positions=4096)
    assert limit.tokens == 512 and limit.reason == "coordinator.max_prompt_tokens=512"
    assert prompt_limit(512, 64, positions=None).tokens == 512


def test_the_model_bounds_the_limit_and_says_so() -> None:
    limit = prompt_limit(512, 8, positions=128)
    assert limit.tokens == 120
    assert "128 positions" in limit.reason and "max_new_tokens=8" in limit.reason


def test_no_room_for_a_prompt_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"max_new_tokens=128 leaves no room .* 128 positions"):
        prompt_limit(512, 128, positions=128)


def test_empty_after_limit_names_limit_and_shortest_prompt() -> None:
    message = empty_after_limit("data.jsonl", 7, 300, prompt_limit(256, 8, positions=None))
    assert "all 7 prompts are longer than 256 tokens" in message
    assert "coordinator.max_prompt_tokens=256" in message and "shortest has 300" in message
