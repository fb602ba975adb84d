"""What a decoder is made of: its dims (read from a Hugging Face config) and what its layers
hold beyond Llama's. Plain data below both ``base`` (a family) and ``decoder`` (the topology
built from them); no torch, transformers or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DecoderDims:
    """The shape-relevant fields of a decoder's Hugging Face config."""

    hidden: int
    """hidden_size."""
    intermediate: int
    """intermediate_size."""
    num_heads: int
    """num_attention_heads."""
    num_kv_heads: int
    """num_key_value_heads."""
    head_dim: int
    """Per-head dimension (hidden // num_heads unless the config says otherwise)."""
    vocab: int
    """vocab_size."""
    num_layers: int
    """num_hidden_layers."""
    tie_embeddings: bool = False
    """tie_word_embeddings: no separate lm_head parameter on the learner."""
    dtype: str = "bfloat16"
    """Parameter dtype name."""
    num_experts: int = 0
    """Routed experts per MoE layer (0: a dense decoder)."""
    moe_intermediate: int = 0
    """Each expert's intermediate size (moe_intermediate_size)."""
    moe_layers: tuple[int, ...] = ()
    """Indices of the layers whose MLP is a mixture of experts; every other layer is dense."""


def decoder_dims_from_config(config: Any, dtype: str) -> DecoderDims:
    """DecoderDims of a Hugging Face decoder config (attribute access only)."""
    num_heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // num_heads
    return DecoderDims(
        hidden=int(config.hidden_size),
        intermediate=int(config.intermediate_size),
        num_heads=num_heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or num_heads),
        head_dim=int(head_dim),
        vocab=int(config.vocab_size),
        num_layers=int(config.num_hidden_layers),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        dtype=dtype,
    )


@dataclass(frozen=True)
class DecoderLayout:
    """What a family's decoder holds beyond Llama's, in Hugging Face names."""

    qkv_bias: bool = False
    """q/k/v projections have biases: column-sliced like their weights, fused into
    ``qkv_proj.bias`` by vLLM (Qwen2)."""
    qk_norm: bool = False
    """Per-head ``self_attn.q_norm`` / ``k_norm`` of size head_dim, replicated (Qwen3)."""
    extra_layer_norms: tuple[str, ...] = ()
    """More per-layer norms of size hidden, replicated (Gemma 2's pre/post feedforward)."""
    engine_head_when_tied: bool = True
    """With tied embeddings vLLM still holds an ``lm_head`` (tied to the embedding, with its
    own packed copy on CPU) that a reload must be fed the embedding under that name; False
    where vLLM computes logits from the embedding itself (Gemma 2)."""
