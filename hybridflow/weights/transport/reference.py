"""Single-process reference: slice full tensors the way FSDP2 and the TP layout hold them.

These functions define the expected results the executors are tested against, and do the
destination-side slicing for the naive executor. They know tensors and the topology, nothing
about ranks' transports.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.resharding.plan import TransferPlan
from hybridflow.resharding.topology import Topology, dest_layout, fsdp_dim0_rows, part_slices


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype: {name!r} is not a torch dtype")
    return dtype


def fsdp_shard(full: torch.Tensor, num_ranks: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s dim-0 shard, as FSDP2's ``fully_shard`` keeps it (unpadded)."""
    start, stop = fsdp_dim0_rows(full.shape[0], num_ranks)[rank]
    return full[start:stop]


def fsdp_shards(
    topology: Topology, full: Mapping[str, torch.Tensor], num_ranks: int, rank: int
) -> dict[str, torch.Tensor]:
    return {p.name: fsdp_shard(full[p.name], num_ranks, rank) for p in topology.params}


def tp_shards(
    topology: Topology, full: Mapping[str, torch.Tensor], tp_size: int, tp_rank: int
) -> dict[str, torch.Tensor]:
    """Every destination parameter's local tensor on ``tp_rank`` of a TP mesh of ``tp_size``."""
    out = {}
    for dest in topology.dests:
        shape, _ = dest_layout(topology, dest, tp_size)
        first = topology.param(dest.parts[0].source)
        local = torch.empty(shape, dtype=torch_dtype(first.dtype), device=full[first.name].device)
        for i, part in enumerate(dest.parts):
            src, dst = part_slices(topology, dest, i, tp_size, tp_rank)
            local[dst].copy_(full[part.source][src])
        out[dest.name] = local
    return out


def allocate_destination(
    plan: TransferPlan, replica: int, tp_rank: int, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Empty local tensors for every destination parameter of ``(replica, tp_rank)``."""
    plan.group_rank(replica, tp_rank)
    out = {}
    for dest in plan.topology.dests:
        shape, _ = dest_layout(plan.topology, dest, plan.replicas[replica])
        dtype = torch_dtype(plan.topology.param(dest.parts[0].source).dtype)
        out[dest.name] = torch.empty(shape, dtype=dtype, device=device)
    return out
