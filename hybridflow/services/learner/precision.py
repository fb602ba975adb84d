"""Precision, activation checkpointing and CPU offload of the learner's models
(``learner.memory``'s ``dtype``, ``activation_checkpointing`` and ``cpu_offload``).

- ``dtype: bfloat16``: sharded (FSDP2), ``fully_shard`` gets
  ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: the sharded
  parameters, their gradients and the AdamW state stay float32, each unit's parameters are
  all-gathered in bf16 and its forward and backward run in bf16, gradients are reduced in
  float32. A single process has no ``fully_shard`` (it needs a process group, and creating one
  would change what every other single-process path sees), so its models keep float32
  parameters and run their forward under ``torch.autocast(bfloat16)``: matmuls in bf16,
  gradients land float32 on the float32 parameters. The same storage, slightly different
  rounding: autocast keeps elementwise ops and the residual stream in float32, FSDP2 runs the
  whole module in bf16. The frozen reference of a sharded learner is held in bf16 outright
  (what the actor's bf16 compute sees, at half the memory); a single process keeps it float32
  under the same autocast as the actor (its log-probs then equal the actor's at step 0).
- ``activation_checkpointing``: each decoder layer's forward runs under non-reentrant
  ``torch.utils.checkpoint`` (what ``checkpoint_wrapper`` does, without wrapping the layer in
  a module of its own: parameter names stay the Hugging Face names the weight sync, the train
  state and the HF checkpoints use). HF's ``gradient_checkpointing_enable`` would do nothing
  here: its layers checkpoint only in training mode and the learner's models stay in eval.
  Applied before ``fully_shard``; FSDP2's pre-backward hook unshards a layer before its
  recomputation reads the parameters.
- ``cpu_offload``: ``fully_shard`` gets ``CPUOffloadPolicy(pin_memory=False on CPU)``. On a
  CPU-only learner everything already lives in CPU memory: it runs and changes nothing. A
  single process has no FSDP to offload with: allowed on CPU (nothing to move), refused on
  CUDA.

With a policy, the root module is resharded after every forward too (FSDP2 leaves the root
unsharded after a forward without backward, e.g. ``compute_logprobs``; its parameters would
then read as bf16 full tensors, or sit on the device, to the weight sync and the train state).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
from torch.utils.checkpoint import checkpoint

from hybridflow.services.learner.memory_config import LearnerMemoryConfig

BF16 = "bfloat16"


def check_memory_config(memory: LearnerMemoryConfig, device_type: str, sharded: bool) -> None:
    """ValueError for a key this learner cannot honour (checked at learner start)."""
    if memory.cpu_offload and device_type == "cuda" and not sharded:
        raise ValueError(
            "learner.memory.cpu_offload needs a sharded learner (FSDP2, nproc_per_node > 1): "
            "a single CUDA process has no fully_shard to offload parameters with"
        )


def fsdp_policies(memory: LearnerMemoryConfig, device_type: str) -> dict[str, Any]:
    """Keyword arguments of ``fully_shard`` for ``memory`` (empty: today's defaults)."""
    kwargs: dict[str, Any] = {}
    if memory.dtype == BF16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if memory.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device_type == "cuda")
    return kwargs


def reference_dtype(memory: LearnerMemoryConfig, sharded: bool) -> torch.dtype:
    """The dtype the frozen reference is loaded in (see the module doc)."""
    return torch.bfloat16 if memory.dtype == BF16 and sharded else torch.float32


def autocast_forward(module: nn.Module, device_type: str) -> None:
    """``module``'s forward, from now on, under ``torch.autocast(device_type, bfloat16)``
    (the single-process ``dtype: bfloat16``; the parameters stay as they are)."""
    module.forward = _wrap_forward(  # type: ignore[method-assign]
        module.forward,
        lambda forward, args, kwargs: _under_autocast(device_type, forward, args, kwargs),
    )


def checkpoint_layers(module: nn.Module, layer_classes: set[str]) -> int:
    """Every submodule of a class in ``layer_classes`` recomputes its activations in the
    backward pass (non-reentrant ``torch.utils.checkpoint``); how many."""
    layers = [m for m in module.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(
            f"{type(module).__name__}: no submodule of classes {sorted(layer_classes)} "
            "to checkpoint"
        )
    for layer in layers:
        layer.forward = _wrap_forward(  # type: ignore[method-assign]
            layer.forward, _checkpointed
        )
    return len(layers)


_Call = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


def _wrap_forward(forward: Callable[..., Any], call: _Call) -> Callable[..., Any]:
    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return call(forward, args, kwargs)

    return wrapped


def _under_autocast(
    device_type: str, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    with torch.autocast(device_type, dtype=torch.bfloat16):
        return forward(*args, **kwargs)


def _checkpointed(
    forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not torch.is_grad_enabled():  # nothing is saved for a backward: nothing to recompute
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
