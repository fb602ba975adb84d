"""FSDP2 plumbing of the learner: sharding, gradient clipping, full (unsharded) state dicts.

``shard_module`` applies ``fully_shard`` to each decoder block and then to the root, over a
1-D mesh of all ranks or of one process group (the actor's or the critic's ranks). Parameters become DTensors sharded on dim 0; names stay the Hugging Face
names. Functions here work the same on unsharded modules, so the single-process path shares
them. This module knows nothing about RL, losses or the relay.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def shard_module(
    module: nn.Module,
    layer_classes: set[str],
    device_type: str,
    world_size: int,
    group: dist.ProcessGroup | None = None,
    policies: dict[str, Any] | None = None,
) -> nn.Module:
    """``fully_shard`` every module whose class name is in ``layer_classes``, then the root,
    over the ``world_size`` ranks of ``group`` (None: the whole world).

    ``policies``: ``fully_shard``'s ``mp_policy`` / ``offload_policy`` (``precision.py``).
    With any, the root is resharded after each forward as well: FSDP2 otherwise keeps it
    unsharded (in the compute dtype, on the device) after a forward without backward."""
    if not layer_classes:
        raise ValueError(f"{type(module).__name__}: no decoder layer classes to shard by")
    mesh = (
        init_device_mesh(device_type, (world_size,))
        if group is None
        else DeviceMesh.from_group(group, device_type)
    )
    blocks = [m for m in module.modules() if type(m).__name__ in layer_classes]
    if not blocks:
        raise ValueError(
            f"{type(module).__name__}: no submodule of classes {sorted(layer_classes)}"
        )
    kwargs = dict(policies or {})
    for block in blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    if kwargs:
        kwargs["reshard_after_forward"] = True
    fully_shard(module, mesh=mesh, **kwargs)
    return module


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global gradient L2 norm (over all ranks' shards); clips in place when ``max_norm > 0``."""
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        # Sharded grads: the partial norms are reduced over the mesh here.
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total.detach()


def iter_full_state_dict(
    module: nn.Module, emit: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every state-dict entry, gathered one at a time.

    Every rank must exhaust the iterator (each sharded entry is a collective); ranks with
    ``emit=False`` take part in the gathers but yield nothing. Tied weights are gathered once
    and yielded under each name. The tensors are detached copies, safe to keep after the next
    optimizer step.
    """
    entries = list(module.state_dict(keep_vars=True).items())
    uses: dict[int, int] = {}
    for _, value in entries:
        uses[id(value)] = uses.get(id(value), 0) + 1
    shared: dict[int, torch.Tensor] = {}
    for name, value in entries:
        key = id(value)
        tensor = shared.get(key)
        if tensor is None:
            detached = value.detach()
            tensor = detached.full_tensor() if isinstance(detached, DTensor) else detached.clone()
            if uses[key] > 1:
                shared[key] = tensor
        uses[key] -= 1
        if uses[key] == 0:
            shared.pop(key, None)
        if emit:
            yield name, tensor
