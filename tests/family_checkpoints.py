"""Tiny random checkpoints of each model family, built locally with transformers' own config
and model classes (nothing is downloaded): 2 layers, hidden 128, 4 heads of 32 with 2 KV
heads (grouped-query), the built-in character tokenizer, the vocabulary padded to 128 so the
vocabulary-parallel split is even at TP 2. Qwen3-MoE: 4 experts of intermediate size 64, top 2,
every layer routed (``mlp_only_layers`` / ``decoder_sparse_step`` make some dense).

Every parameter gets noise on top of transformers' init (biases and norms included), so a
parameter mapped wrongly changes log-probs visibly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB_SIZE = 128
"""The character tokenizer's 101 ids, padded to a multiple of vLLM's vocabulary padding."""
NOISE_STD = 0.05
"""Added to every parameter after transformers' init."""

FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {"use_sliding_window": False},
    "qwen3": {"use_sliding_window": False},
    "gemma2": {},
    "gemma3_text": {},
    "qwen3_moe": {
        "use_sliding_window": False,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
    },
}
"""Extra config fields per model_type (beyond the shared sizes)."""


def build_family_checkpoint(
    out_dir: Path, model_type: str, tied: bool, seed: int = 0, **overrides: Any
) -> Path:
    """A tiny random ``model_type`` causal LM with the character tokenizer, saved HF-style
    (``overrides``: more config fields)."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    from hybridflow.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    sizes: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = CONFIG_MAPPING[model_type](**{**sizes, **FAMILY_CONFIGS[model_type], **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * NOISE_STD)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
