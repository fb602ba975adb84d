"""The model-family registry: one small module per family, looked up by ``model_type``.

In the spirit of torchtitan's per-model state-dict adapters and vLLM's model registry: each
family gives its dims (from the Hugging Face config) and its topology (HF parameter names to
vLLM's tensor-parallel placements; biases, norms, tied head). The vLLM engine, its workers
and the weight-sync planner ask this registry; nothing else checks a ``model_type`` string.
A family missing here is refused with its name and the supported list, never half-mapped.

Importing this package imports no torch, transformers or vLLM.
"""

from __future__ import annotations

from typing import Any

from hybridflow.models.families import gemma2, gemma3, llama, mistral, qwen2, qwen3, qwen3_moe
from hybridflow.models.families.base import VLLM_VOCAB_PADDING, ModelFamily
from hybridflow.models.families.layout import DecoderDims, DecoderLayout, decoder_dims_from_config

FAMILIES: dict[str, ModelFamily] = {
    f.model_type: f
    for f in (
        llama.FAMILY,
        mistral.FAMILY,
        qwen2.FAMILY,
        qwen3.FAMILY,
        qwen3_moe.FAMILY,
        gemma2.FAMILY,
        gemma3.FAMILY,
    )
}
"""Every family the vLLM engine and the tensor-parallel weight sync take, by model_type."""


def supported_model_types() -> tuple[str, ...]:
    """The model_types the registry knows, sorted."""
    return tuple(sorted(FAMILIES))


def family_for(model_type: str | None) -> ModelFamily:
    """The family of ``model_type``; ValueError naming it and the supported ones if none."""
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise ValueError(
            f"model family {model_type!r} is not in the family registry "
            f"(hybridflow/models/families/); supported: {', '.join(supported_model_types())}"
        )
    return family


def family_of_config(config: Any) -> ModelFamily:
    """The family of a Hugging Face config (its ``model_type``)."""
    return family_for(getattr(config, "model_type", None))


__all__ = [
    "FAMILIES",
    "VLLM_VOCAB_PADDING",
    "DecoderDims",
    "DecoderLayout",
    "ModelFamily",
    "decoder_dims_from_config",
    "family_for",
    "family_of_config",
    "supported_model_types",
]
