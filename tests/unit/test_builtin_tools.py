"""``builtin:tiny-tools`` plays the built-in environments: a Qwen3 checkpoint whose tokenizer
makes a tool call a few dozen tokens, whose chat template renders the tool's answers, and
whose warm start was trained on exactly the ids the multi-turn loop builds. (Its quality
gates, measured on real episodes, run in test_builtin_shipped.py with every built-in's.)"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoTokenizer

from hybridflow.builtins_build.tools import episode_tokens, warm_start_conversation
from hybridflow.coordinator.config import MultiTurnConfig
from hybridflow.coordinator.episodes import EpisodeRunner
from hybridflow.data.datasets import load_prompt_dataset
from hybridflow.envs.calculator import ENV_PATH as CALC_ENV
from hybridflow.envs.calculator import TOOL_NAME, calc_demonstration
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.envs.guess_number import ENV_PATH as GUESS_ENV
from hybridflow.envs.guess_number import guess_quarter_demonstration
from hybridflow.envs.runner import LocalEnvironments
from hybridflow.envs.tasks import task_from_row
from hybridflow.envs.tool_calls import format_tool_call, tool_message
from hybridflow.models.bpe_tokenizer import IM_END, chatml_text
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.builtin_tools import ToolsBuiltinSpec
from hybridflow.types import SamplingParams
from tests.unit.envs.test_episodes import ScriptedEngine


@pytest.fixture(scope="module")
def tools_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_builtin_model("tiny-tools", root=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def tok(tools_path: Path) -> Any:
    return AutoTokenizer.from_pretrained(tools_path)


def test_it_is_a_small_qwen3_checkpoint_with_chatml(tools_path: Path, tok: Any) -> None:
    config = AutoConfig.from_pretrained(tools_path)
    assert config.model_type == "qwen3" and config.tie_word_embeddings
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 32)
    assert config.hidden_size == 128 and 2 <= config.num_hidden_layers <= 4
    assert config.max_position_embeddings >= 512
    assert config.vocab_size % 64 == 0 and config.vocab_size >= len(tok)
    assert tok.eos_token == IM_END and config.eos_token_id == tok.eos_token_id
    assert sum(p.stat().st_size for p in tools_path.iterdir()) < 2 * 1024 * 1024


def test_a_tool_call_is_a_few_tokens_and_round_trips(tok: Any) -> None:
    call = format_tool_call(TOOL_NAME, {"expression": "4821*67"})
    ids = tok.encode(call, add_special_tokens=False)
    assert tok.decode(ids) == call
    assert len(ids) <= 30  # 7 of them the expression's characters, one token each
    pieces = [tok.decode([i]) for i in tok.encode("4821", add_special_tokens=False)]
    assert pieces == ["4", "8", "2", "1"]
    for tag, most in (("<answer>", 2), ("<guess>", 2), ("<tool_call>", 3), ("</tool_call>", 4)):
        assert len(tok.encode(tag, add_special_tokens=False)) <= most, tag


def test_the_chat_template_renders_the_tool_role(tok: Any) -> None:
    chat = [
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": format_tool_call(TOOL_NAME, {"expression": "2*3"})},
        {"role": "tool", "content": "6"},
    ]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_end|>\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>assistant\n")
    assert text == chatml_text([(m["role"], m["content"]) for m in chat], generation_prompt=True)
    ids = ChatTokens(tok).observation([tool_message("6")], True)
    assert tok.decode(ids.tolist()) == "\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    ("data", "env"), [("builtin:calc", CALC_ENV), ("builtin:guess", GUESS_ENV)]
)
def test_the_warm_start_trains_on_the_ids_the_loop_builds(tok: Any, data: str, env: str) -> None:
    record = load_prompt_dataset(data, tok, num=1, seed=0)[0]
    row = {
        "prompt": [{"role": "user", "content": record.task_prompt}],
        "reward_model": {"ground_truth": record.ground_truth},
        "extra_info": record.extra_info,
    }
    task = task_from_row(row)
    conversation = (
        calc_demonstration(task) if data == "builtin:calc" else guess_quarter_demonstration(task)
    )
    turns = [m.content for m in conversation if m.role == "assistant"]
    config = MultiTurnConfig(env=env, max_turns=10, max_total_tokens=480)
    runner = EpisodeRunner(LocalEnvironments(), ChatTokens(tok), config)
    batch = runner.run([record], SamplingParams(n=1), ScriptedEngine(tok, turns), "q")
    played = batch.groups[0][0]
    assert batch.records[0][0].success
    ids, labels = episode_tokens(ChatTokens(tok), conversation)
    assert ids == played.prompt_ids.tolist() + played.token_ids.tolist()
    trained = [lab != -100 for lab in labels[len(played.prompt_ids) :]]
    assert trained == [bool(m) for m in played.loss_mask.tolist()]


def test_the_warm_start_mixes_tool_use_with_wrong_direct_answers() -> None:
    spec = ToolsBuiltinSpec()
    rng = random.Random(0)
    calc = [
        c for c in (warm_start_conversation(spec, rng) for _ in range(400)) if c[0].role == "system"
    ]
    direct = [c for c in calc if len(c) == 3]
    assert 0.55 < len(calc) / 400 < 0.75 and 0.35 < len(direct) / len(calc) < 0.65
    for conversation in direct:
        assert conversation[-1].content.startswith("<answer>")
    assert all(len(c) == 5 and c[3].role == "tool" for c in calc if len(c) != 3)
