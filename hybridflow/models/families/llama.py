"""Llama (``LlamaForCausalLM``): the plain decoder; no biases, no q/k norms.

vLLM's ``LlamaForCausalLM`` fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``;
with tied embeddings its ``lm_head`` is tied to the embedding (on CPU it keeps its own packed
copy, so a reload feeds it the embedding too).
"""

from __future__ import annotations

from hybridflow.models.families.base import ModelFamily
from hybridflow.models.families.layout import DecoderLayout

FAMILY = ModelFamily(model_type="llama", layout=DecoderLayout())
