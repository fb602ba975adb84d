"""peft's LoRA layers in a Hugging Face model: the learner's actor and the ``hf`` engine.

``inject`` puts an adapter on every target linear layer (peft's ``inject_adapter_in_model``:
the model stays the transformers class, each target becomes a LoRA layer around its
``base_layer``; A is Kaiming-initialised from torch's RNG, B is zero, so a fresh adapter
changes nothing) and freezes everything but the adapters. ``AdapterParams`` lists the
adapter parameters under their wire names (``names``): what the optimizer, the weight sync
and checkpoints see. ``adapters_off`` runs a forward with every adapter switched off: the
base model, i.e. the KL reference, without a second copy; ``adapters_by_row`` a batch whose
rows each run with an adapter of their own (the Tinker service's samples of many tenants).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import nn

from hybridflow.lora.config import LoraConfig
from hybridflow.lora.names import TableRow, wire_name_of_peft_param


def inject(model: nn.Module, config: LoraConfig) -> nn.Module:
    """Adapters on ``model``'s target layers, in place; every other parameter frozen.
    ValueError when no layer is a target."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    peft_config = PeftLoraConfig(
        r=config.rank,
        lora_alpha=cast(Any, config.alpha),  # typed int by peft; any number scales
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        bias="none",
    )
    try:
        inject_adapter_in_model(peft_config, model)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"learner.lora.target_modules: {exc}") from exc
    for name, param in model.named_parameters():
        param.requires_grad_(wire_name_of_peft_param(name) is not None)
    return model


def base_table(model: nn.Module) -> list[TableRow]:
    """(HF name, shape, dtype) of the base model's parameters, as before injection."""
    return sorted(
        (name.replace(".base_layer.", "."), tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for name, p in model.named_parameters()
        if wire_name_of_peft_param(name) is None
    )


class AdapterParams(nn.Module):
    """The adapters of an injected model as a module of their own: ``named_parameters``
    gives each adapter parameter under its wire name, sorted, looked up in the model at each
    call (FSDP2's ``fully_shard`` replaces parameters with sharded ones: these are always
    the live ones). Nothing is copied and nothing is registered twice."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)  # not a submodule: never sharded or saved
        if not self._items():
            raise ValueError(f"{type(model).__name__} has no LoRA adapters")

    def _items(self) -> list[tuple[str, nn.Parameter]]:
        items = []
        for name, param in self.__dict__["_model"].named_parameters():
            wire = wire_name_of_peft_param(name)
            if wire is not None:
                items.append((wire, param))
        return sorted(items, key=lambda item: item[0])

    def named_parameters(  # type: ignore[override]
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for name, param in self._items():
            yield prefix + name, param

    def state_dict(self, *args: Any, keep_vars: bool = False, **kwargs: Any) -> Any:  # type: ignore[override]
        """Wire name -> parameter (detached unless ``keep_vars``), for ``iter_full_state_dict``."""
        return {name: p if keep_vars else p.detach() for name, p in self._items()}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("AdapterParams holds parameters only")


class AdaptersOff(nn.Module):
    """The actor with its adapters switched off: the frozen base, the KL reference. Holds
    the actor without registering it (nothing is sharded, saved or counted twice); any
    attribute it lacks is the actor's (``config``, ``get_output_embeddings``)."""

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_actor", actor)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with adapters_off(self._actor):
            return self._actor(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_actor"], name)


def tuner_layers(model: nn.Module) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Every adapter of ``model`` switched off inside the block (the base model's outputs)."""
    layers = tuner_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


BASE_ROW = "__base__"
"""peft's name for a row that runs with no adapter in a mixed batch."""


@contextmanager
def adapters_by_row(model: nn.Module, names: list[str]) -> Iterator[None]:
    """Inside the block, row ``i`` of every batch through ``model`` runs with adapter
    ``names[i]`` alone (``BASE_ROW``: none), several adapters in one batch: peft's mixed
    batch, its ``adapter_names`` given to every LoRA layer's forward. Inference only; a
    layer without row ``i``'s adapter leaves that row as the base computes it."""
    handles = [
        layer.register_forward_pre_hook(
            lambda _module, args, kwargs: (args, {**kwargs, "adapter_names": names}),
            with_kwargs=True,
        )
        for layer in tuner_layers(model)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def load_adapters(model: nn.Module, named: list[tuple[str, torch.Tensor]]) -> None:
    """Copy wire-named adapter tensors into an injected model's adapters (all or nothing:
    every name and shape is checked first)."""
    live = dict(AdapterParams(model).named_parameters())
    for name, tensor in named:
        if name not in live:
            raise ValueError(f"load_weights: unknown adapter tensor {name!r} for this model")
        if tuple(tensor.shape) != tuple(live[name].shape):
            raise ValueError(
                f"load_weights: adapter tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"the model's is {tuple(live[name].shape)}"
            )
    for name, tensor in named:
        target = live[name]
        target.copy_(tensor.to(device=target.device, dtype=target.dtype))
