"""``builtin:tiny-qwen3`` looks like a real checkpoint: Qwen3 with grouped-query attention and a
tied head, a byte-level BPE tokenizer with ChatML, and every path the character tokenizer
exercises (chat rendering, EOS, decoding, the torch-free tokenizer, training) works with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hybridflow import RLTrainer
from hybridflow.data.datasets import load_prompt_dataset
from hybridflow.models.bpe_tokenizer import IM_END, build_bpe_tokenizer, chatml_turns
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.testing import mock_reward

REPO = Path(__file__).resolve().parents[2]
CHATML_PROMPT = "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def qwen3_path(tiny_model_path: Path) -> Path:
    return ensure_builtin_model("tiny-qwen3", root=tiny_model_path.parent)


def test_it_is_a_qwen3_checkpoint_with_chatml(qwen3_path: Path) -> None:
    config = AutoConfig.from_pretrained(qwen3_path)
    tok = AutoTokenizer.from_pretrained(qwen3_path)
    assert config.model_type == "qwen3" and config.tie_word_embeddings
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 32)
    assert config.vocab_size % 64 == 0 and config.vocab_size >= len(tok)  # padded, as Qwen's
    assert tok.eos_token == IM_END and config.eos_token_id == tok.eos_token_id
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id != tok.eos_token_id
    chat = [{"role": "user", "content": "3+4="}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        CHATML_PROMPT
    )
    ids = tok.encode(CHATML_PROMPT, add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids)[:2] == ["<|im_start|>", "user"]  # specials are atoms


def test_the_tokenizer_is_byte_level_and_splits_digits() -> None:
    tok = build_bpe_tokenizer([chatml_turns("12+30=", "42")] * 3, vocab_size=300)
    assert [tok.decode([i]) for i in tok.encode("1230", add_special_tokens=False)] == list("1230")
    text = "请写 a poem\t~"  # nothing is unknown: bytes round-trip
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ids = tok.encode("42", add_special_tokens=False) + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "42"


def test_builtin_arith_renders_through_each_chat_template(
    qwen3_path: Path, tiny_model_path: Path
) -> None:
    qwen3 = load_prompt_dataset("builtin:arith", AutoTokenizer.from_pretrained(qwen3_path), num=3)
    char = load_prompt_dataset("builtin:arith", AutoTokenizer.from_pretrained(tiny_model_path), 3)
    for q, c in zip(qwen3, char):
        assert (
            q.prompt_text == f"<|im_start|>user\n{c.prompt_text}<|im_end|>\n<|im_start|>assistant\n"
        )
        assert "<|im_start|>" not in c.prompt_text and c.prompt_text.endswith("=")


def test_the_torch_free_tokenizer_loads_it(qwen3_path: Path) -> None:
    code = (
        "import sys; from hybridflow.models.text_only import load_tokenizer; "
        f"tok = load_tokenizer({str(qwen3_path)!r}); "
        "ids = tok.encode('7', add_special_tokens=False) + [tok.eos_token_id]; "
        "print(repr(tok.decode(ids, skip_special_tokens=True)), 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["'7'", "False"]


def test_greedy_answers_are_digits_then_im_end(qwen3_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(qwen3_path).eval()
    tok = AutoTokenizer.from_pretrained(qwen3_path)
    ids = tok.encode(CHATML_PROMPT, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    answer = out[0, len(ids) :].tolist()
    assert tok.eos_token_id in answer
    assert tok.decode(answer[: answer.index(tok.eos_token_id)]).isdigit()


def test_a_trainer_step_scores_decoded_answers(qwen3_path: Path) -> None:
    seen: list[str] = []

    def reward(prompt: str, response: str) -> float:
        seen.append(response)
        return mock_reward("3+4=", response)

    trainer = RLTrainer(actor=qwen3_path, reward_fn=reward, group_size=4, optimizer={"lr": 1e-3})
    result = trainer.step(prompts=[CHATML_PROMPT])
    assert len(seen) == 4 and all("<|im_end|>" not in r and "<|im" not in r for r in seen)
    assert result.metrics["actor/grad_norm"] > 0 and result.policy_version == 1
    trainer.close()
