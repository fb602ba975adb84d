"""The built-in environments' datasets and demonstrations: rows load through the prompt
loader, each row's prompt is what its environment's reset says, every demonstration replays
through a fresh environment to the success reward, and the SFT file loads in the SFT reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hybridflow.data.datasets import BUILTIN_DATASETS, check_prompt_rows, load_prompt_dataset
from hybridflow.data.preference import read_preference_dataset
from hybridflow.envs.base import Message, StepResult
from hybridflow.envs.builtin import BUILTIN_ENV_DATASETS, builtin_env_dataset
from hybridflow.envs.demonstrations import iter_demonstrations, main, sft_rows
from hybridflow.envs.guess_number import success_reward
from hybridflow.envs.runner import LocalEnvironments, load_environment_class
from hybridflow.envs.tasks import ENV_KEY, messages_to_dicts, task_from_row
from tests.unit.test_datasets import make_tokenizer

SPECS = sorted(BUILTIN_ENV_DATASETS)
NUM_REPLAYED = 64

# Qwen2.5's chat template in structure: ChatML turns, consecutive tool messages rendered as
# <tool_response> blocks inside one user turn.
QWEN_LIKE_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_tokenizer(chat_template=QWEN_LIKE_TEMPLATE)


def test_the_env_datasets_are_builtin_prompt_datasets() -> None:
    assert set(SPECS) == {"builtin:calc", "builtin:guess"}
    assert set(SPECS) <= set(BUILTIN_DATASETS)
    with pytest.raises(ValueError, match="not a built-in environment dataset"):
        builtin_env_dataset("builtin:arith")


@pytest.mark.parametrize("spec", SPECS)
def test_rows_load_through_the_prompt_loader(spec: str, tokenizer: Any) -> None:
    rows = builtin_env_dataset(spec).make_rows(8, 3)
    records = load_prompt_dataset(spec, tokenizer, num=8, seed=3)
    assert len(records) == 8
    for row, record in zip(rows, records, strict=True):
        assert record.prompt_text == tokenizer.apply_chat_template(
            row["prompt"], tokenize=False, add_generation_prompt=True
        )
        assert record.data_source == row["data_source"] == spec.removeprefix("builtin:")
        assert record.ground_truth == row["reward_model"]["ground_truth"]
        assert record.extra_info == row["extra_info"]
        assert record.extra_info[ENV_KEY].startswith("hybridflow.envs.")
    assert check_prompt_rows(spec) == []


@pytest.mark.parametrize("spec", SPECS)
def test_rows_are_seeded_and_a_longer_list_extends_a_shorter_one(spec: str) -> None:
    make_rows = builtin_env_dataset(spec).make_rows
    assert make_rows(20, 5)[:10] == make_rows(10, 5)
    assert make_rows(10, 5) != make_rows(10, 6)


@pytest.mark.parametrize("spec", SPECS)
def test_each_row_s_prompt_is_what_its_environment_says(spec: str) -> None:
    for row in builtin_env_dataset(spec).make_rows(32, 0):
        env = load_environment_class(row["extra_info"][ENV_KEY])()
        assert messages_to_dicts(env.reset(task_from_row(row))) == row["prompt"]
        # Small: the opening messages' text, chat template aside, stays short.
        assert sum(len(m["content"]) for m in row["prompt"]) <= 160


@pytest.mark.parametrize("spec", SPECS)
def test_every_demonstration_replays_to_the_success_reward(spec: str) -> None:
    envs = LocalEnvironments(max_episodes=1)
    rows = builtin_env_dataset(spec).make_rows(NUM_REPLAYED, 0)
    demos = list(iter_demonstrations(spec, NUM_REPLAYED, 0))
    assert len(demos) == len(rows) == NUM_REPLAYED
    for i, (row, demo) in enumerate(zip(rows, demos, strict=True)):
        task = task_from_row(row)
        turns = [j for j, m in enumerate(demo) if m.role == "assistant"]
        assert turns and turns[-1] == len(demo) - 1, "a demonstration ends on the policy's turn"
        opening = envs.reset(str(i), row["extra_info"][ENV_KEY], task)
        assert list(opening) == demo[: turns[0]]
        result = StepResult()
        tool_calls = tool_errors = 0  # per-step counters, summed as the rollout loop does
        for k, j in enumerate(turns):
            result = envs.step(str(i), demo[j].content)
            tool_calls += result.info.get("tool_calls", 0)
            tool_errors += result.info.get("tool_errors", 0)
            if j != turns[-1]:
                assert not result.done
                assert list(result.observation) == demo[j + 1 : turns[k + 1]]
        assert result.done and result.info["success"] is True
        if spec == "builtin:calc":
            assert result.reward == 1.0
            assert (tool_calls, tool_errors) == (1, 0)
        else:
            assert result.reward == success_reward(len(turns), row["extra_info"]["max_guesses"])
            assert len(turns) <= 7  # binary search over 1..100
        assert envs.num_live == 0


def test_sft_rows_are_one_per_assistant_turn() -> None:
    demo = [
        Message("user", "q"),
        Message("assistant", "a1"),
        Message("tool", "r"),
        Message("assistant", "a2"),
    ]
    assert sft_rows(demo) == [
        {
            "prompt": [{"role": "user", "content": "q"}],
            "response": [{"role": "assistant", "content": "a1"}],
        },
        {
            "prompt": messages_to_dicts(demo[:3]),
            "response": [{"role": "assistant", "content": "a2"}],
        },
    ]


@pytest.mark.parametrize("spec", SPECS)
def test_the_sft_file_loads_in_the_sft_reader(spec: str, tmp_path: Path, tokenizer: Any) -> None:
    out = tmp_path / "sft.jsonl"
    assert main(["--data", spec, "--num", "4", "--seed", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    demos = list(iter_demonstrations(spec, 4, 1))
    assert rows == [row for demo in demos for row in sft_rows(demo)]
    records = read_preference_dataset(str(out), tokenizer, "sft")
    assert len(records) == len(rows)
    for row, record in zip(rows, records, strict=True):
        completion = tokenizer.decode(list(record.completion_ids))
        assert completion == row["response"][0]["content"] + "<|im_end|>\n"
