"""What a replica needs to join a weight-sync group: the wire-side description of a group.

Plain dataclasses: no torch, no grpc (conversions live in ``hybridflow.weights.convert``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.resharding.layout import ReplicaLayout


@dataclass(frozen=True)
class GroupSpec:
    """Everything a replica needs to join a weight-sync group and compute the same plan."""

    store_host: str
    """Host of the TCPStore the group meets at (served by learner rank 0)."""
    store_port: int
    """Port of that TCPStore."""
    group_name: str
    """Prefix of the group's store keys; a rebuilt group gets a new name."""
    backend: str
    """"gloo" or "nccl"."""
    num_src_ranks: int
    """Learner (source) ranks: the FSDP world size."""
    replica_tp_sizes: tuple[int, ...]
    """Tensor-parallel size of every replica in the group, in group order."""
    bucket_bytes: int
    """Largest flat bucket of the transfer plan."""
    executor: str
    """"planner" (point-to-point along the plan) or "naive" (gather + broadcast oracle)."""
    timeout_s: float
    """Seconds any collective of the group may take before it fails."""
    delta: bool = False
    """After the first sync, socket buckets carry only what changed (``transport/delta``)."""
    check_samples: int = 0
    """After the first sync, the check reads this many elements of each slice; 0: every
    byte at every sync (``weight_sync.check``)."""


@dataclass(frozen=True)
class ReplicaDescription:
    """What a replica tells the learner before a weight-sync group forms (``Describe``)."""

    tp_size: int
    """Tensor-parallel ranks it brings (each a destination rank)."""
    layout: ReplicaLayout
    """Its family and how it places every learner parameter, from the model it loaded."""
