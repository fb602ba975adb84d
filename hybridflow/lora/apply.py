"""A replica's side of a LoRA sync: what it takes in, and applying it to a model it holds.

``AdapterTarget`` serves the ``hf`` engine (and vLLM's workers in ``merged`` mode): it knows
the adapter table of the model (wire names, shapes), checks a received set against it (all
or nothing), and applies it in one of two ways (``weight_sync.lora``):

- ``adapter``: the model carries peft's LoRA layers; the tensors are copied into them;
- ``merged``: the model stays plain; each adapted weight becomes ``W0 + scale * B @ A``
  from a copy of its original ``W0`` (kept once, so updates never accumulate rounding).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from hybridflow.lora.config import LoraConfig
from hybridflow.lora.names import TableRow, adapted_layers, adapter_table, merged, pairs
from hybridflow.lora.peft_layers import base_table, inject, load_adapters

MODES = ("adapter", "merged")


class AdapterTarget:
    """The adapters of one model in this process (module doc)."""

    def __init__(self, model: nn.Module, config: LoraConfig, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"weight_sync.lora must be one of {MODES}, got {mode!r}")
        self.config = config
        self.mode = mode
        self._model = model
        rows = base_table(model)
        self.table: list[TableRow] = adapter_table(rows, config.target_modules, config.rank)
        self._shapes = {name: shape for name, shape, _ in self.table}
        self._base: dict[str, torch.Tensor] = {}
        self._weights: dict[str, nn.Parameter] = {}
        if mode == "adapter":
            inject(model, config)
        else:
            params = dict(model.named_parameters())
            for layer, _, _ in adapted_layers(rows, config.target_modules):
                weight = params[f"{layer}.weight"]
                self._weights[layer] = weight
                self._base[layer] = weight.detach().clone()

    def check(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """ValueError naming the first tensor that is not one of the adapters (name, shape,
        float dtype), or an adapter that is missing: a sync carries all of them."""
        seen = set()
        for name, tensor in named:
            if name not in self._shapes:
                raise ValueError(f"load_weights: {name!r} is not an adapter tensor of this model")
            if tuple(tensor.shape) != self._shapes[name]:
                raise ValueError(
                    f"load_weights: adapter tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"the model's is {self._shapes[name]}"
                )
            if not tensor.is_floating_point():
                raise ValueError(f"load_weights: adapter tensor {name!r} is {tensor.dtype}")
            seen.add(name)
        missing = sorted(set(self._shapes) - seen)
        if missing:
            raise ValueError(
                f"load_weights: a LoRA sync carries every adapter; missing {missing[:3]}"
            )

    @torch.no_grad()
    def apply(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.check(named)
        if self.mode == "adapter":
            load_adapters(self._model, list(named))
            return
        for layer, (a, b) in pairs(named).items():
            weight = self._weights[layer]
            weight.copy_(merged(self._base[layer], a, b, self.config.scale))
