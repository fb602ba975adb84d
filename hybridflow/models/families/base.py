"""What a model family is: its dims read from a Hugging Face config, and its topology.

A family names the learner's parameters (Hugging Face state-dict names and global shapes) and
places each on a rollout replica's tensor-parallel mesh the way vLLM's model class for it
does (column, row, vocabulary-parallel, replicated; fused ``qkv_proj`` and ``gate_up_proj``).
Every family here is a decoder laid out like Llama; a ``DecoderLayout`` says what its layers
hold beyond Llama's (biases, q/k norms, more norms) and how vLLM holds the head; a mixture of
experts says in its dims which layers route to experts (``DecoderDims.moe_layers``).

Pure: names, shapes and placements only; no torch, transformers or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridflow.resharding.topology import Placement, Topology, dest_layout

VLLM_VOCAB_PADDING = 64
"""vLLM pads the vocabulary to a multiple of this before splitting it over TP ranks."""


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


@dataclass(frozen=True)
class ModelFamily:
    """One family of the registry: a ``model_type`` and its decoder layout."""

    model_type: str
    """The Hugging Face ``config.model_type`` this family serves."""
    layout: DecoderLayout
    """What its layers hold beyond Llama's."""

    def dims(self, config: Any, dtype: str) -> DecoderDims:
        """The dims of a Hugging Face config of this family."""
        return decoder_dims_from_config(config, dtype)

    def topology(
        self, dims: DecoderDims, fused: bool = True, vocab_placement: Placement = Placement.VOCAB
    ) -> Topology:
        """Learner parameters and vLLM's parameters built from them (``fused``: vLLM's own
        names, ``qkv_proj`` and ``gate_up_proj``; else HF names, each split on its own)."""
        from hybridflow.models.families.decoder import decoder_topology

        return decoder_topology(dims, self.layout, fused, vocab_placement)

    def sliced_topology(self, dims: DecoderDims) -> Topology:
        """What a tensor-parallel vLLM worker receives: its slice of each HF tensor.

        Unfused (HF names: vLLM's loaders fuse qkv and gate_up themselves). The vocabulary
        is split like vLLM splits it only when no padding is needed (``vocab`` a multiple of
        ``VLLM_VOCAB_PADDING``); otherwise vLLM's rows per rank differ from an even split and
        the embedding travels whole to every rank.
        """
        vocab = Placement.VOCAB if dims.vocab % VLLM_VOCAB_PADDING == 0 else Placement.REPLICATED
        return self.topology(dims, fused=False, vocab_placement=vocab)

    def engine_tied_head(self, dims: DecoderDims) -> str | None:
        """The name a reload feeds the tied embedding under as well, else None."""
        if dims.tie_embeddings and self.layout.engine_head_when_tied:
            return "lm_head.weight"
        return None

    def engine_param_shapes(self, dims: DecoderDims, tp_size: int) -> dict[str, tuple[int, ...]]:
        """Name -> local shape of every checkpoint-format parameter a vLLM worker of a
        ``tp_size`` replica holds (fused names; the vocabulary padded, then split)."""
        topology = self.topology(dims, fused=True)
        shapes: dict[str, tuple[int, ...]] = {}
        for dest in topology.dests:
            if dest.parts[0].placement is Placement.VOCAB:
                padded = -(-dims.vocab // VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
                shapes[dest.name] = (padded // tp_size, dims.hidden)
            else:
                shapes[dest.name] = dest_layout(topology, dest, tp_size)[0]
        head = self.engine_tied_head(dims)
        if head is not None:
            shapes[head] = shapes["model.embed_tokens.weight"]
        return shapes
