"""Resharding: move learner (FSDP2 dim-0) shards into rollout replicas' tensor-parallel layout.

Pure planning only (``topology``, ``coverage``, ``layout``, ``plan``, ``buckets``): numpy, no
torch. The torch side that runs a plan (the weight-sync group, executors, same-host links)
is ``hybridflow.weights.transport``. What a model's parameters are and how vLLM places them is
each model family's (``hybridflow.models.families``); this package is generic.
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
