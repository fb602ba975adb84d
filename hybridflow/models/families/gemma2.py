"""Gemma 2 (``Gemma2ForCausalLM``): Llama's decoder with four norms per layer, always tied.

Beyond Llama's: ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` (hidden,
replicated). What differs in the forward needs no weight transformation: vLLM's
``GemmaRMSNorm`` computes ``x * (1 + w)`` from the stored ``w`` exactly as transformers'
does, the embedding is scaled by ``sqrt(hidden)`` on both sides, and attention and final
logit soft-capping are config, not weights. vLLM's ``Gemma2ForCausalLM`` has no head of its
own (logits come from the embedding), so the tied head is never fed and an untied config is
refused.
"""

from __future__ import annotations

from typing import Any

from hybridflow.models.families.base import ModelFamily
from hybridflow.models.families.layout import DecoderDims, DecoderLayout

GEMMA_FEEDFORWARD_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
"""The per-layer norms Gemma 2 and 3 add around the MLP."""


class Gemma2Family(ModelFamily):
    """Gemma 2: refuses what vLLM's Gemma 2 cannot hold (an untied head, attention biases)."""

    def dims(self, config: Any, dtype: str) -> DecoderDims:
        dims = super().dims(config, dtype)
        if not dims.tie_embeddings:
            raise ValueError(
                "gemma2 with tie_word_embeddings=false: vLLM's Gemma2ForCausalLM has no head "
                "of its own to load one into"
            )
        if getattr(config, "attention_bias", False):
            raise ValueError("gemma2 with attention_bias=true is not in the family registry")
        return dims


FAMILY = Gemma2Family(
    model_type="gemma2",
    layout=DecoderLayout(extra_layer_norms=GEMMA_FEEDFORWARD_NORMS, engine_head_when_tied=False),
)
