"""The built-in environments in the coordinator's multi-turn loop: a dataset row loaded by the
prompt loader, played by an engine scripted with the row's demonstration, ends in success
with the success reward and the tool counters the environment reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridflow.coordinator.config import MultiTurnConfig
from hybridflow.coordinator.episodes import EpisodeRunner
from hybridflow.data.datasets import load_prompt_dataset
from hybridflow.envs.builtin import BUILTIN_ENV_DATASETS, builtin_env_dataset
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.envs.guess_number import success_reward
from hybridflow.envs.runner import LocalEnvironments
from hybridflow.envs.tasks import ENV_KEY, task_from_row
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer
from hybridflow.types import SamplingParams
from tests.unit.envs.test_episodes import ScriptedEngine

NUM_ROWS = 3


@pytest.fixture(scope="module")
def chatml(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("models")
    return load_tokenizer(ensure_builtin_model("tiny-qwen3", root=Path(root)))


@pytest.mark.parametrize("spec", sorted(BUILTIN_ENV_DATASETS))
def test_a_demonstration_played_through_the_loop_succeeds(spec: str, chatml: Any) -> None:
    entry = builtin_env_dataset(spec)
    rows = entry.make_rows(NUM_ROWS, 0)
    records = load_prompt_dataset(spec, chatml, num=NUM_ROWS, seed=0)
    for row, record in zip(rows, records, strict=True):
        assert record.task_prompt == task_from_row(row).prompt
        demo = entry.demonstration(task_from_row(row))
        turns = [m.content for m in demo if m.role == "assistant"]
        config = MultiTurnConfig(
            env=row["extra_info"][ENV_KEY], max_turns=10, max_total_tokens=4096
        )
        run = EpisodeRunner(LocalEnvironments(), ChatTokens(chatml), config)
        batch = run.run([record], SamplingParams(n=1), ScriptedEngine(chatml, turns), "q")
        episode = batch.records[0][0]
        assert (episode.finish, episode.success, episode.turns) == ("done", True, len(turns))
        if spec == "builtin:calc":
            assert batch.results[0][0].score == 1.0
            assert (episode.tool_calls, episode.tool_errors) == (1, 0)
        else:
            max_guesses = row["extra_info"]["max_guesses"]
            assert batch.results[0][0].score == success_reward(len(turns), max_guesses)
