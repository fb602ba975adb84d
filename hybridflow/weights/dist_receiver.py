"""The replica side of weight sync: one ``DistReceiver`` per destination rank (a rollout
replica's TP rank) joins each weight-sync group the learner forms and receives its part of
every sync.

A receive that fails aborts this rank's group and raises; the learner sees the failure (its
receive call fails, or its deadline passes) and rebuilds the group, which this rank is asked
to join again. This module knows nothing of gRPC (the rollout engines and vLLM workers drive
it) nor of the learner's side: forming the group is ``dist_formation``'s, sending
``dist_publisher``'s.
"""

from __future__ import annotations

import torch

from hybridflow.resharding.plan import TransferPlan
from hybridflow.resharding.topology import Placement, Topology, part_slices
from hybridflow.weights.dist_formation import ParamTable, join_group
from hybridflow.weights.spec import GroupSpec
from hybridflow.weights.transport.executors import DistExecutor, NaiveExecutor
from hybridflow.weights.transport.group import WeightSyncGroup

VLLM_CUTS_ITSELF = (Placement.VOCAB, Placement.EXPERT_COLUMN, Placement.EXPERT_ROW)
"""Placements whose vLLM loaders take the whole tensor and cut each rank's part themselves
(vocabulary-parallel tables, FusedMoE's experts): a rank's slice goes in at full size."""


class DistReceiver:
    """Rollout side, one per destination rank (a replica's TP rank): joins groups and
    receives that rank's part of the weights (whole tensors at TP 1): into fresh tensors over
    sockets, or, from learner ranks on this host, into a shared staging buffer whose tensors
    stay valid while referenced (``weights.transport.same_host``)."""

    def __init__(
        self,
        table: ParamTable,
        device: torch.device,
        tp_rank: int = 0,
        sliced: Topology | None = None,
        whole: bool = False,
    ) -> None:
        """``whole``: every TP rank receives whole tensors (a LoRA adapter's), not slices."""
        self._whole = whole
        self._table = list(table)
        self._device = device
        self._tp_rank = tp_rank
        self._sliced = sliced
        self._group: WeightSyncGroup | None = None
        self._executor: DistExecutor | NaiveExecutor | None = None
        self.plan: TransferPlan | None = None
        self.tp_size = 1

    def join(self, spec: GroupSpec, replica_index: int) -> str:
        self.close()
        joined = join_group(
            spec, replica_index, self._table, self._device, self._tp_rank, self._sliced, self._whole
        )
        self._group, self._executor, self.plan, self.tp_size = joined
        return joined.plan.content_hash()

    def in_full_size(self, name: str, local: torch.Tensor) -> torch.Tensor | None:
        """This rank's slice of a tensor whose vLLM loader cuts the rank's part out of the
        whole itself (vocabulary-parallel tables, FusedMoE experts), placed where that loader
        reads it in an uninitialised full-size tensor (the rest is never touched); None for
        any other tensor."""
        if self.plan is None:
            return None
        topology = self.plan.topology
        dest = next((d for d in topology.dests if d.name == name), None)
        if dest is None or dest.parts[0].placement not in VLLM_CUTS_ITSELF:
            return None
        full = torch.empty(topology.param(dest.parts[0].source).shape, dtype=local.dtype)
        for i in range(len(dest.parts)):
            src, dst = part_slices(topology, dest, i, self.tp_size, self._tp_rank)
            full[src].copy_(local[dst])
        return full

    def receive(self) -> tuple[list[tuple[str, torch.Tensor]], int]:
        if self._executor is None or self._group is None:
            raise ValueError("no weight-sync group: call JoinWeightSync first")
        try:
            result = self._executor.sync(None)
        except Exception:
            self.close(abort=True)
            raise
        return list(result.tensors.items()), result.stats.num_bytes_received

    def close(self, abort: bool = False) -> None:
        if self._executor is not None:
            self._executor.close()
        if self._group is not None:
            self._group.abort() if abort else self._group.close()
        self._group, self._executor = None, None
