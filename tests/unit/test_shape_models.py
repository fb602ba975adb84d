"""Shape models: a real checkpoint's exact dims with random weights, built locally."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.models.shapes import QWEN25_05B, SHAPES, ModelShape, ensure_shape_model


def test_the_qwen25_05b_shape_has_the_real_dims_and_parameter_count() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.models import ensure_builtin_model
    from hybridflow.models.shapes import shape_config

    tokenizer = AutoTokenizer.from_pretrained(ensure_builtin_model(QWEN25_05B.tokenizer_from))
    config = shape_config(QWEN25_05B, tokenizer)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("qwen2", 896, 24)
    assert (config.num_attention_heads, config.num_key_value_heads) == (14, 2)
    assert (config.intermediate_size, config.vocab_size) == (4864, 151936)
    assert config.tie_word_embeddings
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == QWEN25_05B.num_parameters() == 494_032_768  # Qwen2.5-0.5B's count
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # q/k/v biases
    assert max(tokenizer.get_vocab().values()) < config.vocab_size


def test_a_shape_is_built_once_into_the_cache_and_loads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    small = ModelShape(
        model_type="qwen2",
        dims={
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "intermediate_size": 128,
            "vocab_size": 1024,
            "max_position_embeddings": 256,
            "tie_word_embeddings": True,
        },
    )
    SHAPES["test-small-shape"] = small
    try:
        path = ensure_shape_model("test-small-shape", root=tmp_path)
        assert path.name == f"test-small-shape-{small.digest()}"
        stamp = (path / "model.safetensors").stat().st_mtime_ns
        assert ensure_shape_model("test-small-shape", root=tmp_path) == path
        assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert sum(p.numel() for p in model.parameters()) == small.num_parameters()
        assert model.config.eos_token_id == tokenizer.eos_token_id
        again = ModelShape(small.model_type, small.dims)
        assert again.digest() == small.digest()  # the directory is named by the shape
    finally:
        del SHAPES["test-small-shape"]


def test_an_unknown_shape_and_a_vocab_too_small_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown shape model"):
        ensure_shape_model("nope", root=tmp_path)
    tiny_vocab = ModelShape("qwen2", {**QWEN25_05B.dims, "vocab_size": 8})
    SHAPES["test-tiny-vocab"] = tiny_vocab
    try:
        with pytest.raises(ValueError, match="over the shape's vocab_size 8"):
            ensure_shape_model("test-tiny-vocab", root=tmp_path)
        assert not list(tmp_path.glob("test-tiny-vocab-*"))  # nothing half-built left
    finally:
        del SHAPES["test-tiny-vocab"]
