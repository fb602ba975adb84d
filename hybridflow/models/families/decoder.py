"""The topology of a Llama-shaped decoder placed like vLLM places it on each TP mesh.

Source names are HF's state-dict names (what the FSDP2 learner holds). Destination names and
placements follow vLLM's decoder classes (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ...):
``qkv_proj`` (QKVParallelLinear: per TP rank ``cat([q_t, k_t, v_t])``, KV heads replicated
when ``T > num_kv_heads``; its bias the same way), ``o_proj`` row, ``gate_up_proj``
(``cat([gate_t, up_t])``), ``down_proj`` row, embeddings and ``lm_head`` vocab-parallel,
norms replicated. As in vLLM, ``T`` should divide ``num_heads``; the planner itself checks
element divisibility only. With ``fused=False`` the destination keeps HF names and splits
each projection on its own. This module knows dims, layouts and names only.
"""

from __future__ import annotations

from hybridflow.models.families.base import DecoderDims, DecoderLayout
from hybridflow.resharding.topology import DestParam, DestPart, ParamSpec, Placement, Topology

COL, ROW, REP = Placement.COLUMN, Placement.ROW, Placement.REPLICATED


def decoder_topology(
    dims: DecoderDims,
    layout: DecoderLayout | None = None,
    fused: bool = True,
    vocab_placement: Placement = Placement.VOCAB,
) -> Topology:
    """Source params and vLLM-style destination params for a decoder of ``dims`` (``layout``
    None: Llama's)."""
    layout = layout or DecoderLayout()
    h = dims.hidden
    params: list[ParamSpec] = [ParamSpec("model.embed_tokens.weight", (dims.vocab, h), dims.dtype)]
    dests: list[DestParam] = [_single("model.embed_tokens.weight", vocab_placement)]
    for i in range(dims.num_layers):
        layer_params, layer_dests = _layer(f"model.layers.{i}.", dims, layout, fused)
        params += layer_params
        dests += layer_dests
    params.append(ParamSpec("model.norm.weight", (h,), dims.dtype))
    dests.append(_single("model.norm.weight", REP))
    if not dims.tie_embeddings:
        params.append(ParamSpec("lm_head.weight", (dims.vocab, h), dims.dtype))
        dests.append(_single("lm_head.weight", vocab_placement))
    return Topology(tuple(params), tuple(dests))


def _layer(
    p: str, dims: DecoderDims, layout: DecoderLayout, fused: bool
) -> tuple[list[ParamSpec], list[DestParam]]:
    h, q_rows = dims.hidden, dims.num_heads * dims.head_dim
    kv_rows = dims.num_kv_heads * dims.head_dim
    attn, mlp = p + "self_attn.", p + "mlp."
    shapes: dict[str, tuple[int, ...]] = {
        attn + "q_proj.weight": (q_rows, h),
        attn + "k_proj.weight": (kv_rows, h),
        attn + "v_proj.weight": (kv_rows, h),
    }
    if layout.qkv_bias:
        shapes |= {
            attn + "q_proj.bias": (q_rows,),
            attn + "k_proj.bias": (kv_rows,),
            attn + "v_proj.bias": (kv_rows,),
        }
    shapes[attn + "o_proj.weight"] = (h, q_rows)
    norms = [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    norms += [p + name + ".weight" for name in layout.extra_layer_norms]
    if layout.qk_norm:
        shapes |= {
            attn + "q_norm.weight": (dims.head_dim,),
            attn + "k_norm.weight": (dims.head_dim,),
        }
    shapes |= {
        mlp + "gate_proj.weight": (dims.intermediate, h),
        mlp + "up_proj.weight": (dims.intermediate, h),
        mlp + "down_proj.weight": (h, dims.intermediate),
    }
    shapes |= {name: (h,) for name in norms}
    params = [ParamSpec(name, shape, dims.dtype) for name, shape in shapes.items()]

    dests = _qkv(attn, "weight", dims, fused)
    if layout.qkv_bias:
        dests += _qkv(attn, "bias", dims, fused)
    dests.append(_single(attn + "o_proj.weight", ROW))
    if layout.qk_norm:
        dests += [_single(attn + "q_norm.weight", REP), _single(attn + "k_norm.weight", REP)]
    gate, up = DestPart(mlp + "gate_proj.weight", COL), DestPart(mlp + "up_proj.weight", COL)
    if fused:
        dests.append(DestParam(mlp + "gate_up_proj.weight", (gate, up)))
    else:
        dests += [DestParam(gate.source, (gate,)), DestParam(up.source, (up,))]
    dests.append(_single(mlp + "down_proj.weight", ROW))
    dests += [_single(name, REP) for name in norms]
    return params, dests


def _qkv(attn: str, kind: str, dims: DecoderDims, fused: bool) -> list[DestParam]:
    """q, k, v (weights or biases) column-split, KV heads at most ``num_kv_heads`` shards."""
    q = DestPart(f"{attn}q_proj.{kind}", COL)
    k = DestPart(f"{attn}k_proj.{kind}", COL, dims.num_kv_heads)
    v = DestPart(f"{attn}v_proj.{kind}", COL, dims.num_kv_heads)
    if fused:
        return [DestParam(f"{attn}qkv_proj.{kind}", (q, k, v))]
    return [DestParam(part.source, (part,)) for part in (q, k, v)]


def _single(name: str, placement: Placement, max_shards: int | None = None) -> DestParam:
    return DestParam(name, (DestPart(name, placement, max_shards),))
