"""The benchmarked models' shapes and their synthetic, reproducible weights.

Weights are a closed-form function of (parameter index, global row, column), so a source rank
can build exactly its FSDP dim-0 rows without ever holding the full tensor (its peak RSS then
measures the executor, not the benchmark), and a receiver can rebuild the expected values to
check what arrived. Every value is an exactly representable float32: the integer expression
stays below 2**24 and the same elementwise ops run on every side.

This module knows shapes and values; it does not know ranks, groups or transports.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.models.families import DecoderDims, DecoderLayout
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.topology import Topology

MODULUS = 1021


@dataclass(frozen=True)
class BenchModel:
    """One benchmarked model."""

    name: str
    """Key used on the command line (``--models``)."""
    dims: DecoderDims
    """Shapes of the Llama (fp32)."""
    note: str
    """How the shapes were chosen (printed into the results)."""
    layout: DecoderLayout = DecoderLayout()
    """What the family adds to Llama's decoder (Qwen3: q/k norms)."""


MODELS: dict[str, BenchModel] = {
    # Built-in tiny model (hybridflow.models.builtin): vocab 101 from the char tokenizer, padded
    # to 102 here because the planner needs an even vocab split at TP 2 (vLLM pads the
    # destination only; the planner does not model destination padding).
    "tiny": BenchModel(
        "tiny",
        DecoderDims(
            hidden=64,
            intermediate=256,
            num_heads=2,
            num_kv_heads=2,
            head_dim=32,
            vocab=102,
            num_layers=2,
            tie_embeddings=True,
            dtype="float32",
        ),  # fmt: skip
        "builtin tiny shapes, tied embeddings; vocab 101 padded to 102 for an even TP 2 split",
    ),
    "small": BenchModel(
        "small",
        DecoderDims(
            hidden=256,
            intermediate=688,
            num_heads=4,
            num_kv_heads=4,
            head_dim=64,
            vocab=8000,
            num_layers=4,
            tie_embeddings=False,
            dtype="float32",
        ),  # fmt: skip
        "7,260,416 parameters, fp32: quick checks between tiny and 100m",
    ),
    "100m": BenchModel(
        "100m",
        DecoderDims(
            hidden=640,
            intermediate=1728,
            num_heads=10,
            num_kv_heads=10,
            head_dim=64,
            vocab=32000,
            num_layers=12,
            tie_embeddings=False,
            dtype="float32",
        ),  # fmt: skip
        "Llama from config dims: 100,449,920 parameters, fp32, untied",
    ),
    "qwen3-100m": BenchModel(
        "qwen3-100m",
        DecoderDims(
            hidden=768,
            intermediate=2048,
            num_heads=12,
            num_kv_heads=4,
            head_dim=64,
            vocab=32000,
            num_layers=12,
            tie_embeddings=True,
            dtype="float32",
        ),  # fmt: skip
        "Qwen3-shaped (q/k norms, 12 query heads over 4 KV heads, tied head): "
        "100,094,208 parameters, fp32",
        DecoderLayout(qk_norm=True),
    ),
    "0.5b": BenchModel(
        "0.5b",
        DecoderDims(
            hidden=896,
            intermediate=4864,
            num_heads=14,
            num_kv_heads=2,
            head_dim=64,
            vocab=151936,
            num_layers=24,
            tie_embeddings=True,
            dtype="float32",
        ),  # fmt: skip
        "Qwen2.5-0.5B's dims (builtin:qwen2.5-0.5b-shape: q/k/v biases, 14 query heads over "
        "2 KV heads, tied head): 494,032,768 parameters, fp32",
        DecoderLayout(qkv_bias=True),
    ),
}


def get_model(name: str) -> BenchModel:
    if name not in MODELS:
        raise ValueError(f"models: unknown model {name!r}; choose from {sorted(MODELS)}")
    return MODELS[name]


def topology_of(model: BenchModel) -> Topology:
    """Source (HF names) and vLLM-style fused destination parameters."""
    return decoder_topology(model.dims, model.layout, fused=True)


def num_params(topology: Topology) -> int:
    total = 0
    for p in topology.params:
        n = 1
        for d in p.shape:
            n *= d
        total += n
    return total


def param_rows(index: int, shape: tuple[int, ...], row_lo: int, row_hi: int) -> torch.Tensor:
    """Rows ``[row_lo, row_hi)`` of parameter ``index`` (global shape ``shape``), float32.

    Value at (r, c) = ((index * 7919 + r * 131 + c * 7) mod 1021) / 1021 - 0.5; built in place
    so the only allocation is the result.
    """
    cols = 1
    for d in shape[1:]:
        cols *= d
    rows = torch.arange(row_lo, row_hi, dtype=torch.float32).mul_(131.0).add_(index * 7919.0)
    out = rows[:, None] + torch.arange(cols, dtype=torch.float32).mul_(7.0)[None, :]
    out.remainder_(float(MODULUS)).div_(float(MODULUS)).sub_(0.5)
    return out.view(row_hi - row_lo, *shape[1:])


def full_tensors(topology: Topology) -> dict[str, torch.Tensor]:
    """Every parameter in full (receivers use it to check, after timing)."""
    return {p.name: param_rows(i, p.shape, 0, p.shape[0]) for i, p in enumerate(topology.params)}
