"""The topology of a Llama-shaped decoder placed like vLLM places it on each TP mesh.

Source names are HF's state-dict names (what the FSDP2 learner holds). Destination names and
placements follow vLLM's decoder classes (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ...):
``qkv_proj`` (QKVParallelLinear: per TP rank ``cat([q_t, k_t, v_t])``, KV heads replicated
when ``T > num_kv_heads``; its bias the same way), ``o_proj`` row, ``gate_up_proj``
(``cat([gate_t, up_t])``), ``down_proj`` row, embeddings and ``lm_head`` vocab-parallel,
norms replicated. A mixture-of-experts layer (``dims.moe_layers``) holds transformers'
fused expert tensors, ``mlp.experts.gate_up_proj`` (experts, 2*I, hidden: gate rows, then up)
and ``mlp.experts.down_proj`` (experts, hidden, I), and the router ``mlp.gate.weight``
(experts, hidden); vLLM's FusedMoE at TP holds every expert on every rank with its
intermediate dim split, ``experts.routed_experts.w13_weight`` = ``cat([gate_t, up_t], dim=1)``
(experts, 2*I/T, hidden) and ``w2_weight`` (experts, hidden, I/T); the router is replicated.
As in vLLM, ``T`` should divide ``num_heads``; the planner itself checks
element divisibility only. With ``fused=False`` the destination keeps HF names and splits
each projection on its own. This module knows dims, layouts and names only.
"""

from __future__ import annotations

from hybridflow.models.families.layout import DecoderDims, DecoderLayout
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
        if i in dims.moe_layers:
            layer_params, layer_dests = _with_experts(layer_params, layer_dests, i, dims, fused)
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


def _with_experts(
    params: list[ParamSpec], dests: list[DestParam], i: int, dims: DecoderDims, fused: bool
) -> tuple[list[ParamSpec], list[DestParam]]:
    """A layer's dense MLP swapped for the router and the experts (in transformers' order)."""
    mlp = f"model.layers.{i}.mlp."
    dense = {mlp + n + ".weight" for n in ("gate_proj", "up_proj", "down_proj")}
    h, e, inter = dims.hidden, dims.num_experts, dims.moe_intermediate
    gate_up, down = mlp + "experts.gate_up_proj", mlp + "experts.down_proj"
    experts = [
        ParamSpec(gate_up, (e, 2 * inter, h), dims.dtype),
        ParamSpec(down, (e, h, inter), dims.dtype),
        ParamSpec(mlp + "gate.weight", (e, h), dims.dtype),
    ]
    at = next(k for k, p in enumerate(params) if p.name in dense)
    params = [p for p in params if p.name not in dense]
    params[at:at] = experts
    w13 = tuple(DestPart(gate_up, Placement.EXPERT_COLUMN, None, b, 2) for b in (0, 1))
    w2 = (DestPart(down, Placement.EXPERT_ROW),)
    vllm = mlp + "experts.routed_experts."
    moe = [
        DestParam(vllm + "w13_weight" if fused else gate_up, w13),
        DestParam(vllm + "w2_weight" if fused else down, w2),
        _single(mlp + "gate.weight", REP),
    ]
    dense_dests = {mlp + "gate_up_proj.weight"} | dense
    at = next(k for k, d in enumerate(dests) if d.name in dense_dests)
    dests = [d for d in dests if d.name not in dense_dests]
    dests[at:at] = moe
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
