"""Gemma 3, text only (``model_type`` ``gemma3_text``, vLLM's ``Gemma3ForCausalLM``).

Gemma 2's four norms per layer plus per-head ``q_norm`` / ``k_norm`` (head_dim, replicated,
``GemmaRMSNorm``: stored ``w``, applied as ``1 + w`` on both sides, so no transformation).
Unlike Gemma 2, vLLM's Gemma 3 holds an ``lm_head`` tied to the embedding, fed like Llama's.
Local/global attention layers and their two RoPE bases are config, not weights.
"""

from __future__ import annotations

from typing import Any

from hybridflow.models.families.base import ModelFamily
from hybridflow.models.families.gemma2 import GEMMA_FEEDFORWARD_NORMS
from hybridflow.models.families.layout import DecoderDims, DecoderLayout


class Gemma3TextFamily(ModelFamily):
    """Gemma 3 text: refuses attention biases (not mapped here)."""

    def dims(self, config: Any, dtype: str) -> DecoderDims:
        if getattr(config, "attention_bias", False):
            raise ValueError("gemma3_text with attention_bias=true is not in the family registry")
        return super().dims(config, dtype)


FAMILY = Gemma3TextFamily(
    model_type="gemma3_text",
    layout=DecoderLayout(qk_norm=True, extra_layer_norms=GEMMA_FEEDFORWARD_NORMS),
)
