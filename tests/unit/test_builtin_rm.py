"""The built-in reward model ``builtin:tiny-rm``: resolved like ``builtin:tiny``, a one-logit
Llama sequence classifier with a pad token, built deterministically from the train split
(the shipped weights' hashes and quality: ``test_builtin_shipped.py``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from hybridflow.builtins_build.reward_model import (
    build_reward_checkpoint,
    train_problems,
    wrong_response,
)
from hybridflow.data.arith import heldout_problems
from hybridflow.models import resolve_model_path
from hybridflow.models.builtin import builtin_names, read_manifest
from hybridflow.models.builtin_rm import RewardModelSpec


def test_tiny_rm_resolves_to_a_one_logit_classifier(
    tiny_rm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tiny_rm_path.name == f"tiny-rm-{read_manifest()['tiny-rm'].digest}"
    monkeypatch.setenv("HYBRIDFLOW_HOME", str(tiny_rm_path.parent.parent))
    assert resolve_model_path("builtin:tiny-rm") == tiny_rm_path
    config = AutoConfig.from_pretrained(tiny_rm_path)
    assert config.architectures == ["LlamaForSequenceClassification"]
    assert config.num_labels == 1 and config.pad_token_id == 0
    assert builtin_names() == [
        "tiny",
        "tiny-code",
        "tiny-qwen3",
        "tiny-random",
        "tiny-rm",
        "tiny-tools",
    ]


def test_training_data_never_holds_a_held_out_problem_or_a_right_negative() -> None:
    train = train_problems(9)
    assert len(train) == 80 and not set(train) & heldout_problems(9)
    rng = random.Random(0)
    for a, b in train:
        for _ in range(20):
            assert wrong_response(a, b, rng) != str(a + b)


def test_the_build_is_deterministic(tmp_path: Path) -> None:
    micro = RewardModelSpec(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        batch_size=4,
        lm_steps=2,
        joint_steps=2,
    )
    build_reward_checkpoint(micro, tmp_path / "a")
    build_reward_checkpoint(micro, tmp_path / "b")
    first = load_file(tmp_path / "a" / "model.safetensors")
    second = load_file(tmp_path / "b" / "model.safetensors")
    assert first.keys() == second.keys() and "score.weight" in first
    assert all(torch.equal(first[k], second[k]) for k in first)
