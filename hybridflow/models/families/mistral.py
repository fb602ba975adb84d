"""Mistral (``MistralForCausalLM``): Llama-shaped in Hugging Face's layout.

vLLM's ``MistralForCausalLM`` subclasses its Llama; HF-format checkpoints load under Llama's
names (its own name remapping applies to Mistral's consolidated format only).
"""

from __future__ import annotations

from hybridflow.models.families.base import ModelFamily
from hybridflow.models.families.layout import DecoderLayout

FAMILY = ModelFamily(model_type="mistral", layout=DecoderLayout())
