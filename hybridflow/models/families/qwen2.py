"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): Llama's decoder with q/k/v biases.

vLLM's ``Qwen2Attention`` builds ``qkv_proj`` with ``bias=True``: each bias is column-sliced
like its weight (the KV biases replicated with their heads when ``T > num_kv_heads``) and
the three are fused into ``qkv_proj.bias``. ``o_proj`` has no bias.
"""

from __future__ import annotations

from hybridflow.models.families.base import ModelFamily
from hybridflow.models.families.layout import DecoderLayout

FAMILY = ModelFamily(model_type="qwen2", layout=DecoderLayout(qkv_bias=True))
