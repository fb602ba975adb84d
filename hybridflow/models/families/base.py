"""What a model family is: its dims read from a Hugging Face config, and its topology.

A family names the learner's parameters (Hugging Face state-dict names and global shapes) and
places each on a rollout replica's tensor-parallel mesh the way vLLM's model class for it
does (column, row, vocabulary-parallel, replicated; fused ``qkv_proj`` and ``gate_up_proj``).
Every family here is a decoder laid out like Llama; a ``DecoderLayout`` says what its layers
hold beyond Llama's (biases, q/k norms, more norms) and how vLLM holds the head; a mixture of
experts says in its dims which layers route to experts (``DecoderDims.moe_layers``).

Pure: names, shapes and placements only; no torch, transformers or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridflow.models.families.decoder import decoder_topology
from hybridflow.models.families.layout import DecoderDims, DecoderLayout, decoder_dims_from_config
from hybridflow.resharding.topology import Placement, Topology, dest_layout

VLLM_VOCAB_PADDING = 64
"""vLLM pads the vocabulary to a multiple of this before splitting it over TP ranks."""


@dataclass(frozen=True)
class ModelFamily:
    """One family of the registry: a ``model_type`` and its decoder layout."""

    model_type: str
    """The Hugging Face ``config.model_type`` this family serves."""
    layout: DecoderLayout
    """What its layers hold beyond Llama's."""

    def dims(self, config: Any, dtype: str) -> DecoderDims:
        """The dims of a Hugging Face config of this family."""
        return decoder_dims_from_config(config, dtype)

    def topology(
        self, dims: DecoderDims, fused: bool = True, vocab_placement: Placement = Placement.VOCAB
    ) -> Topology:
        """Learner parameters and vLLM's parameters built from them (``fused``: vLLM's own
        names, ``qkv_proj`` and ``gate_up_proj``; else HF names, each split on its own)."""
        return decoder_topology(dims, self.layout, fused, vocab_placement)

    def sliced_topology(self, dims: DecoderDims) -> Topology:
        """What a tensor-parallel vLLM worker receives: its slice of each HF tensor.

        Unfused (HF names: vLLM's loaders fuse qkv and gate_up themselves). The vocabulary
        is split like vLLM splits it only when no padding is needed (``vocab`` a multiple of
        ``VLLM_VOCAB_PADDING``); otherwise vLLM's rows per rank differ from an even split and
        the embedding travels whole to every rank.
        """
        vocab = Placement.VOCAB if dims.vocab % VLLM_VOCAB_PADDING == 0 else Placement.REPLICATED
        return self.topology(dims, fused=False, vocab_placement=vocab)

    def engine_tied_head(self, dims: DecoderDims) -> str | None:
        """The name a reload feeds the tied embedding under as well, else None."""
        if dims.tie_embeddings and self.layout.engine_head_when_tied:
            return "lm_head.weight"
        return None

    def engine_param_shapes(self, dims: DecoderDims, tp_size: int) -> dict[str, tuple[int, ...]]:
        """Name -> local shape of every checkpoint-format parameter a vLLM worker of a
        ``tp_size`` replica holds (fused names; the vocabulary padded, then split)."""
        topology = self.topology(dims, fused=True)
        shapes: dict[str, tuple[int, ...]] = {}
        for dest in topology.dests:
            if dest.parts[0].placement is Placement.VOCAB:
                padded = -(-dims.vocab // VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
                shapes[dest.name] = (padded // tp_size, dims.hidden)
            else:
                shapes[dest.name] = dest_layout(topology, dest, tp_size)[0]
        head = self.engine_tied_head(dims)
        if head is not None:
            shapes[head] = shapes["model.embed_tokens.weight"]
        return shapes
