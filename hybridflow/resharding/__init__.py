"""Resharding: move learner (FSDP2 dim-0) shards into rollout replicas' tensor-parallel layout.

Pure planning (``topology``, ``coverage``, ``plan``, ``buckets``) imports numpy only; the torch
side (``reference``, ``replay``, ``group``, ``executors``, and for same-host pairs ``shm``,
``staging``, ``same_host``) is imported from its modules. What a model's parameters are and how
vLLM places them is each model family's (``hybridflow.models.families``); this package is generic.
"""

from hybridflow.resharding.plan import TransferPlan, make_plan
from hybridflow.resharding.plan_types import Bucket, RankRole, Transfer
from hybridflow.resharding.topology import (
    DestParam,
    DestPart,
    ParamSpec,
    Placement,
    Topology,
    fsdp_dim0_rows,
)

__all__ = [
    "Bucket",
    "DestParam",
    "DestPart",
    "ParamSpec",
    "Placement",
    "RankRole",
    "Topology",
    "Transfer",
    "TransferPlan",
    "fsdp_dim0_rows",
    "make_plan",
]
