"""A hand-out keeps what a multi-turn episode needs of its row: the environment is reset with
the row's own prompt, not with its text rendered through the chat template."""

from __future__ import annotations

from pathlib import Path

from hybridflow.coordinator.cursor import Handout
from hybridflow.coordinator.episodes import task_of
from hybridflow.data.datasets import load_prompt_dataset
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer


def test_a_handout_resets_the_environment_with_the_rows_own_prompt(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(ensure_builtin_model("tiny-qwen3", root=tmp_path))
    record = load_prompt_dataset("builtin:calc", tokenizer, num=1, seed=0)[0]
    assert record.prompt_text.startswith("<|im_start|>system")  # rendered: not the task
    handout = Handout.of(record, epoch=0, seq=0)
    assert task_of(handout).prompt == record.task_prompt == "What is 3583 + 6206 + 9986?"
