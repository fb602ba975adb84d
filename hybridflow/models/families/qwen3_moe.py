"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's attention, a mixture of experts for MLPs.

transformers 5.17 holds each MoE layer's experts fused, ``mlp.experts.gate_up_proj``
(experts, 2*moe_intermediate, hidden; gate rows first) and ``mlp.experts.down_proj``
(experts, hidden, moe_intermediate), and the router ``mlp.gate.weight`` (experts, hidden); its
checkpoints on disk name every expert on its own, and vLLM's loader takes either. vLLM 0.32's
FusedMoE at TP T holds every expert on every rank, each split like a column (gate and up) or
row (down) linear: ``experts.routed_experts.w13_weight`` (experts, 2*I/T, hidden),
``w2_weight`` (experts, hidden, I/T); the router is replicated. Layers listed in
``mlp_only_layers``, or off ``decoder_sparse_step``, are dense like Qwen3's, the rule both
transformers and vLLM apply. Shared experts (Qwen2-MoE's) and attention biases are refused.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hybridflow.models.families.base import ModelFamily
from hybridflow.models.families.layout import DecoderDims, DecoderLayout


def moe_layer_indices(config: Any) -> tuple[int, ...]:
    """The layers whose MLP is a mixture of experts, by transformers' and vLLM's rule."""
    num_experts = int(getattr(config, "num_experts", 0) or 0)
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    return tuple(
        i
        for i in range(int(config.num_hidden_layers))
        if i not in dense and num_experts > 0 and (i + 1) % step == 0
    )


class Qwen3MoeFamily(ModelFamily):
    """Qwen3-MoE: the expert dims from the config; refuses what is not mapped here."""

    def dims(self, config: Any, dtype: str) -> DecoderDims:
        if getattr(config, "attention_bias", False):
            raise ValueError("qwen3_moe with attention_bias=true is not in the family registry")
        if int(getattr(config, "shared_expert_intermediate_size", 0) or 0) > 0:
            raise ValueError("qwen3_moe with shared experts is not in the family registry")
        moe_layers = moe_layer_indices(config)
        if not moe_layers:
            # vLLM's Qwen3MoeForCausalLM refuses a model without one ("No Qwen3MoE layer").
            raise ValueError("qwen3_moe with no mixture-of-experts layer: use qwen3")
        return replace(
            super().dims(config, dtype),
            num_experts=int(config.num_experts),
            moe_intermediate=int(config.moe_intermediate_size),
            moe_layers=moe_layers,
        )


FAMILY = Qwen3MoeFamily(model_type="qwen3_moe", layout=DecoderLayout(qk_norm=True))
