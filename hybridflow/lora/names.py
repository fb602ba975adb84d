"""An adapter's tensors by name: on the wire, in PEFT's files, from a base model's table.

On the wire (and in every table the weight sync plans with) an adapter of the linear layer
``model.layers.0.self_attn.q_proj`` is two tensors: ``...q_proj.lora_A.weight`` ``[r, in]``
and ``...q_proj.lora_B.weight`` ``[out, r]``; the layer's output becomes
``W x + scale * B (A x)``. PEFT's adapter files name the same tensors with a
``base_model.model.`` prefix; peft's live modules put the adapter's name before ``.weight``
(``lora_A.default.weight``). Pure: names, shapes and one matrix product.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TableRow = tuple[str, tuple[int, ...], str]
"""(name, shape, dtype) of one tensor, as the weight sync's tables hold them."""

PEFT_PREFIX = "base_model.model."
A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"


def adapted_layers(base_table: Iterable[TableRow], targets: Sequence[str]) -> list[TableRow]:
    """The base model's 2-D ``<layer>.weight`` tensors whose layer's last name is a target,
    as (layer path, (out, in), dtype), sorted."""
    wanted = set(targets)
    out = []
    for name, shape, dtype in base_table:
        if not name.endswith(".weight") or len(shape) != 2:
            continue
        layer = name.removesuffix(".weight")
        if layer.rsplit(".", 1)[-1] in wanted:
            out.append((layer, (int(shape[0]), int(shape[1])), dtype))
    return sorted(out)


def adapter_table(
    base_table: Iterable[TableRow], targets: Sequence[str], rank: int
) -> list[TableRow]:
    """(wire name, shape, dtype) of every adapter tensor the targets give, sorted by name;
    ValueError when no layer of the base model is a target."""
    layers = adapted_layers(base_table, targets)
    if not layers:
        raise ValueError(
            f"learner.lora.target_modules {list(targets)} names no linear layer of this model"
        )
    rows: list[TableRow] = []
    for layer, (out_features, in_features), dtype in layers:
        rows.append((layer + A_SUFFIX, (rank, in_features), dtype))
        rows.append((layer + B_SUFFIX, (out_features, rank), dtype))
    return sorted(rows)


def layer_of(wire_name: str) -> tuple[str, str]:
    """(layer path, "A" or "B") of a wire name; ValueError for any other name."""
    for suffix, which in ((A_SUFFIX, "A"), (B_SUFFIX, "B")):
        if wire_name.endswith(suffix):
            return wire_name.removesuffix(suffix), which
    raise ValueError(f"{wire_name!r} is not an adapter tensor (…lora_A.weight / …lora_B.weight)")


def pairs(
    named: Iterable[tuple[str, torch.Tensor]],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Layer path -> (A, B); ValueError naming a layer that lacks one of the two."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        layer, which = layer_of(name)
        halves.setdefault(layer, {})[which] = tensor
    out = {}
    for layer, got in halves.items():
        if set(got) != {"A", "B"}:
            raise ValueError(f"adapter of {layer}: has {sorted(got)} of lora_A and lora_B")
        out[layer] = (got["A"], got["B"])
    return out


def merged(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``weight + scale * b @ a`` in fp32, returned in ``weight``'s dtype (a new tensor)."""
    delta = (b.float() @ a.float()) * scale
    return (weight.float() + delta).to(weight.dtype)


def peft_file_name(wire_name: str) -> str:
    """The name PEFT's ``adapter_model.safetensors`` gives a wire tensor."""
    return PEFT_PREFIX + wire_name


def wire_name_of_peft_param(param_name: str, adapter: str = "default") -> str | None:
    """The wire name of a live peft parameter (``...lora_A.default.weight``), None for a
    parameter that is not an adapter's A or B."""
    for half in ("lora_A", "lora_B"):
        marker = f".{half}.{adapter}.weight"
        if param_name.endswith(marker):
            return param_name.removesuffix(marker) + f".{half}.weight"
    return None
