"""Qwen3 (``Qwen3ForCausalLM``): Llama's decoder with per-head q/k RMS norms, no biases.

vLLM's ``Qwen3Attention`` holds ``q_norm`` and ``k_norm`` of size ``head_dim`` whole on every
TP rank (they act on each head). Qwen3's ``attention_bias`` is false in every released
config; a config with it set is refused by the registry rather than half-mapped.
"""

from __future__ import annotations

from typing import Any

from hybridflow.models.families.base import ModelFamily
from hybridflow.models.families.layout import DecoderDims, DecoderLayout


class Qwen3Family(ModelFamily):
    """Qwen3: refuses ``attention_bias`` (not mapped here)."""

    def dims(self, config: Any, dtype: str) -> DecoderDims:
        if getattr(config, "attention_bias", False):
            raise ValueError(
                "qwen3 with attention_bias=true is not supported by the family registry"
            )
        return super().dims(config, dtype)


FAMILY = Qwen3Family(model_type="qwen3", layout=DecoderLayout(qk_norm=True))
