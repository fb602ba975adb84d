"""The built-in tiny model and its character tokenizer load through the normal HF paths."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.builtins_build.policy import warmup_example
from hybridflow.models import resolve_model_path
from hybridflow.models.builtin import ensure_builtin_model, read_manifest, spec_hash
from hybridflow.models.builtin_policy import BuiltinSpec
from hybridflow.models.tokenizer import CHARACTERS, build_char_tokenizer


def test_char_tokenizer_ids_and_round_trip() -> None:
    tok = build_char_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(CHARACTERS) == 101
    # ' ' is id 4 and the rest of printable ASCII follows in code-point order.
    assert tok.encode("3+4=") == [4 + ord("3") - 32, 4 + ord("+") - 32, 4 + ord("4") - 32, 33]
    text = "a+b= {x}\n\t~ Hello, world!"
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.decode([*tok.encode("17"), tok.eos_token_id], skip_special_tokens=True) == "17"
    assert tok.encode("é") == [tok.unk_token_id]


def test_tokenizer_saves_and_loads_with_auto_tokenizer(tmp_path: Path) -> None:
    build_char_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.encode("12+30=") == build_char_tokenizer().encode("12+30=")
    assert tok.eos_token == "<eos>" and tok.eos_token_id == 2
    chat = [{"role": "user", "content": "3+4="}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == "3+4="
    two_turns = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert tok.apply_chat_template(two_turns, tokenize=False) == "S\nQ"


def test_builtin_model_loads_via_from_pretrained(tiny_model_path: Path) -> None:
    assert (tiny_model_path / "config.json").is_file()
    assert (tiny_model_path / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tok) == 101
    assert model.config.eos_token_id == tok.eos_token_id == 2
    ids = torch.tensor([tok.encode("3+4=")])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, 4, 101)
    assert torch.isfinite(logits).all()


def test_warm_start_taught_the_format(tiny_model_path: Path) -> None:
    """Greedy continuation of every prompt is 1-2 digits then EOS (the answer may be wrong)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    prompts = ["0+0=", "3+4=", "9+9=", "5+7="]
    for prompt in prompts:
        ids = tok.encode(prompt)
        for _ in range(3):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == tok.eos_token_id:
                break
        answer = ids[len(tok.encode(prompt)) :]
        assert answer[-1] == tok.eos_token_id, prompt
        text = tok.decode(answer, skip_special_tokens=True)
        assert isinstance(text, str) and text.isdigit(), prompt


def test_ensure_is_cached_and_named_by_the_weights_digest(tiny_model_path: Path) -> None:
    again = ensure_builtin_model("tiny", root=tiny_model_path.parent)
    assert again == tiny_model_path
    assert tiny_model_path.name == f"tiny-{read_manifest()['tiny'].digest}"
    assert spec_hash(BuiltinSpec()) == spec_hash(BuiltinSpec())
    assert spec_hash(BuiltinSpec(noisy_steps=1)) != spec_hash(BuiltinSpec())
    leftovers = [
        p.name for p in tiny_model_path.parent.iterdir() if p.is_dir() and p.name.startswith(".")
    ]
    assert leftovers == []


def test_warmup_example_near_misses() -> None:
    import random

    rng = random.Random(0)
    answers = {warmup_example(1, 1, 0.0, 2, rng)[1] for _ in range(200)}
    assert answers == {"0", "1", "3", "4"}  # 2 +- 1..2, never the true sum, never negative
    assert warmup_example(1, 1, 1.0, 2, rng) == ("1+1=", "2")


def test_concurrent_callers_share_one_directory(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = list(pool.map(lambda _: ensure_builtin_model("tiny", root=tmp_path), range(4)))
    assert paths == [tmp_path / f"tiny-{read_manifest()['tiny'].digest}"] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [paths[0].name, f".{paths[0].name}.lock"]
    )
    assert AutoModelForCausalLM.from_pretrained(paths[0]).config.hidden_size == 64


def test_resolve_model_path(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_model_path(str(tiny_model_path)) == tiny_model_path
    monkeypatch.setenv("HYBRIDFLOW_HOME", str(tiny_model_path.parent.parent))
    assert resolve_model_path("builtin:tiny") == tiny_model_path
    with pytest.raises(ValueError, match="not-a-dir"):
        resolve_model_path(str(tmp_path / "not-a-dir"))
    with pytest.raises(ValueError, match="unknown builtin model 'huge'"):
        resolve_model_path("builtin:huge")
