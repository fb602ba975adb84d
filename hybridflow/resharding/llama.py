"""The topology of a HF ``LlamaForCausalLM`` placed like vLLM's Llama on each TP mesh.

Source names are HF's state-dict names (what the FSDP2 learner holds). Destination names and
placements follow vLLM's ``LlamaForCausalLM``: ``qkv_proj`` (QKVParallelLinear: per TP rank
``cat([q_t, k_t, v_t])``, KV heads replicated when ``T > num_kv_heads``), ``o_proj`` row,
``gate_up_proj`` (``cat([gate_t, up_t])``), ``down_proj`` row, embeddings and ``lm_head``
vocab-parallel, norms replicated. As in vLLM, ``T`` should divide ``num_heads``; the
planner itself checks element divisibility only. With ``fused=False`` the destination keeps HF names and
splits each projection on its own. This module knows dims and names only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridflow.resharding.topology import DestParam, DestPart, ParamSpec, Placement, Topology


@dataclass(frozen=True)
class LlamaDims:
    """The shape-relevant fields of a Llama config."""

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
    """tie_word_embeddings: no separate lm_head parameter on either side."""
    dtype: str = "bfloat16"
    """Parameter dtype name."""


VLLM_VOCAB_PADDING = 64
"""vLLM pads the vocabulary to a multiple of this before splitting it over TP ranks."""


def llama_dims_from_config(config: Any, dtype: str) -> LlamaDims:
    """LlamaDims of a Hugging Face Llama config (attribute access only)."""
    num_heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // num_heads
    return LlamaDims(
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


def vllm_sliced_topology(dims: LlamaDims) -> Topology:
    """What a tensor-parallel vLLM worker receives: its slice of each Hugging Face tensor.

    Unfused (HF names: vLLM's loaders fuse qkv and gate_up themselves). The vocabulary is
    split like vLLM splits it only when no padding is needed (``vocab`` a multiple of
    ``VLLM_VOCAB_PADDING``); otherwise vLLM's rows per rank differ from an even split and the
    embedding travels whole to every rank.
    """
    vocab = Placement.VOCAB if dims.vocab % VLLM_VOCAB_PADDING == 0 else Placement.REPLICATED
    return llama_topology(dims, fused=False, vocab_placement=vocab)


def llama_topology(
    dims: LlamaDims, fused: bool = True, vocab_placement: Placement = Placement.VOCAB
) -> Topology:
    """Source params and vLLM-style destination params for a Llama of ``dims``."""
    h, q_rows, kv_rows = (
        dims.hidden,
        dims.num_heads * dims.head_dim,
        dims.num_kv_heads * dims.head_dim,
    )
    params: list[ParamSpec] = [ParamSpec("model.embed_tokens.weight", (dims.vocab, h), dims.dtype)]
    dests: list[DestParam] = [_single("model.embed_tokens.weight", vocab_placement)]
    col, row, rep = Placement.COLUMN, Placement.ROW, Placement.REPLICATED
    for i in range(dims.num_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        shapes = {
            attn + "q_proj.weight": (q_rows, h),
            attn + "k_proj.weight": (kv_rows, h),
            attn + "v_proj.weight": (kv_rows, h),
            attn + "o_proj.weight": (h, q_rows),
            mlp + "gate_proj.weight": (dims.intermediate, h),
            mlp + "up_proj.weight": (dims.intermediate, h),
            mlp + "down_proj.weight": (h, dims.intermediate),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        params += [ParamSpec(name, shape, dims.dtype) for name, shape in shapes.items()]
        q = DestPart(attn + "q_proj.weight", col)
        k = DestPart(attn + "k_proj.weight", col, dims.num_kv_heads)
        v = DestPart(attn + "v_proj.weight", col, dims.num_kv_heads)
        gate, up = DestPart(mlp + "gate_proj.weight", col), DestPart(mlp + "up_proj.weight", col)
        if fused:
            dests += [
                DestParam(attn + "qkv_proj.weight", (q, k, v)),
                _single(attn + "o_proj.weight", row),
                DestParam(mlp + "gate_up_proj.weight", (gate, up)),
            ]
        else:
            dests += [DestParam(part.source, (part,)) for part in (q, k, v)]
            dests += [
                _single(attn + "o_proj.weight", row),
                DestParam(gate.source, (gate,)),
                DestParam(up.source, (up,)),
            ]
        dests += [
            _single(mlp + "down_proj.weight", row),
            _single(p + "input_layernorm.weight", rep),
            _single(p + "post_attention_layernorm.weight", rep),
        ]
    params.append(ParamSpec("model.norm.weight", (h,), dims.dtype))
    dests.append(_single("model.norm.weight", rep))
    if not dims.tie_embeddings:
        params.append(ParamSpec("lm_head.weight", (dims.vocab, h), dims.dtype))
        dests.append(_single("lm_head.weight", vocab_placement))
    return Topology(tuple(params), tuple(dests))


def _single(name: str, placement: Placement, max_shards: int | None = None) -> DestParam:
    return DestParam(name, (DestPart(name, placement, max_shards),))
