"""Weight-sync settings (imports without torch or grpc)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems

MIB = 1024 * 1024
CHECK_SAMPLES = 256
"""Elements of each slice a sampled check reads (``weight_sync.check``): 4 runs of 64. A stale
slice differs in nearly every element an fp32 step moves, so 256 miss it with odds below
10^-77 when half moved; 1,024 cost 1.24-1.30x a 100M shared-memory copy here against 1.07-1.25x
(docs/weight-sync.md)."""


@dataclass
class WeightSyncConfig:
    """How the learner's weights reach the rollout replicas."""

    transport: Literal["dist", "grpc"] = "dist"
    """dist: torch.distributed group (gloo on CPU, NCCL on GPU); grpc: streaming fallback."""
    executor: Literal["planner", "naive"] = "planner"
    """dist only: planner (point-to-point along the resharding plan) or naive (gather on
    learner rank 0, broadcast full tensors: the correctness oracle / "planner off")."""
    shared_memory: Literal["auto", "off"] = "auto"
    """planner only: auto lets a rollout rank keep its received tensors in POSIX shared memory
    that learner ranks on the same host (same hostname and boot id) copy their slices straight
    into (CPU/gloo groups; one model-sized buffer in /dev/shm per rollout rank, a second while
    an update waits to be applied), the rest over the group's sockets; off: sockets for every
    pair."""
    delta: bool = False
    """planner only: after a group's first sync, the buckets that go over sockets (not a
    same-host copy) carry only the elements that changed since the last sync, as indices and
    values in the wire dtype (``transport/delta.py``; exact: the replica ends bit-equal to a
    full sync, which the delivery check verifies). Costs one more copy of the weights on each
    side; a rebuilt group (a failure, a replica joining or leaving) starts with a full sync."""
    check: Literal["auto", "exact", "sampled"] = "auto"
    """How each sync over the group is checked on every replica before it serves
    (``transport/checked.py``): exact reads every byte on both sides, at every sync; sampled
    reads every byte at a group's first sync (so every join, rejoin and rebuild) and then
    ``CHECK_SAMPLES`` elements of each slice, at positions that move from sync to sync; auto:
    exact on NCCL (a read of GPU memory is a small share of a sync over the network), sampled
    on gloo (where the wire is memory too: an exact check cost 1.3-4.4x the sync here, a
    sampled one 1.07-1.25x). Delta syncs are always checked exactly (docs/weight-sync.md "Every
    sync is checked")."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """auto: nccl when the learner runs on CUDA, else gloo."""
    store_host: str = knob("127.0.0.1", free="an address, checked when the group forms")
    """Address learner rank 0 serves the group's TCPStore on (reachable by every replica)."""
    bucket_bytes: int = knob(64 * MIB, ge=4096)
    """Largest flat bucket of the transfer plan."""
    timeout_s: float = knob(120.0, gt=0)
    """Deadline of one sync (and of forming the group); past it the group is rebuilt."""
    allowed_hosts: list[str] = knob(
        default_factory=lambda: ["127.0.0.1", "localhost", "::1"],
        free="host names, matched against each publish target (at least one: validate)",
    )
    """Hosts PublishWeights and StartPublish may send to (a target is host:port); loopback
    only by default. List the rollout hosts of a multi-host deployment here."""
    connect_timeout_s: float = knob(5.0, gt=0)
    """Each target must answer a Describe probe within this before a sync starts; else the
    publish fails at once with UNAVAILABLE naming it (the learner's lock is not held)."""

    lora: Literal["adapter", "merged"] = "adapter"
    """With ``learner.lora``, what a replica does with the adapters it receives (only they
    travel): adapter: serves them as a LoRA adapter (vLLM: a new adapter id per sync; hf:
    peft's layers); merged: merges them into its base weights (docs/lora.md)."""
    verify: bool = False
    """Also check every full-weight sync with the log-prob probe (``weights/verify.py``); LoRA
    syncs always are. Every sync over the group is checked slice by slice in any case
    (``weights/transport/checked.py``, docs/weight-sync.md "Every sync is checked")."""
    verify_tolerance: float = knob(1e-4, gt=0)
    """Largest |learner - replica| log-prob on the probe a verified sync may show (fp32; a
    bfloat16 replica needs ~0.1)."""

    def validate(self) -> None:
        """Each field's bound, plus: at least one allowed host."""
        raise_problems(
            [
                *field_problems(self, "weight_sync"),
                None if self.allowed_hosts else "weight_sync.allowed_hosts: list at least one host",
            ]
        )
