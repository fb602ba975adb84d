"""What one benchmark variant runs: a picklable description handed to every spawned rank.

No torch import here, so the orchestrator can build specs before starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["planner", "shm", "naive", "grpc"]
KINDS: tuple[str, ...] = ("planner", "shm", "naive", "grpc")


@dataclass(frozen=True)
class VariantSpec:
    """One process set: a model, a transport/executor and a destination TP size."""

    model: str
    """Key into ``models.MODELS``."""
    kind: Kind
    """planner (DistExecutor over gloo sockets), shm (DistExecutor, same-host pairs through
    shared memory), naive (NaiveExecutor) or grpc (UpdateWeights stream)."""
    tp: int
    """Destination tensor-parallel size (grpc: always 1, full tensors)."""
    num_src: int
    """Learner (FSDP dim-0) source ranks (grpc: one learner rank 0 holding full tensors)."""
    bucket_bytes: int
    """Transfer-plan bucket size (planner) and the plan both executors are built from."""
    chunk_bytes: int
    """gRPC chunk size of the weight stream."""
    num_warmup: int
    """Untimed syncs first."""
    num_syncs: int
    """Timed syncs; the reported time is their median."""
    raw_broadcast: bool
    """Planner sets: afterwards, broadcast the per-destination byte count in the same group."""
    timeout_s: float
    """Deadline of the group, the store and every RPC."""
    store_port: int
    """Port of the TCPStore the orchestrator serves on 127.0.0.1."""
    check: bool = True
    """planner/shm/naive: every slice fingerprinted on both sides (``weights/transport/
    checked.py``, the default); False measures what that costs (label ``..._nocheck``)."""
    check_samples: int = 0
    """With ``check``: after the first sync, fingerprint this many elements of each slice
    instead of every byte (``weight_sync.check: sampled``; label ``..._sampled``)."""
    alternate: bool = False
    """With ``check_samples``: the timed syncs alternate unchecked (even) and sampled (odd) in
    one process set, so the check's cost is read from neighbouring syncs instead of two runs
    that differ by up to 20 % here (label ``..._alternating``)."""
    parity_syncs: int = 0
    """planner/shm at TP 1: after timing, this many syncs of changed weights, each followed by
    the log-prob parity of a fixed batch (destination vs the learner's full weights)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: {self.kind!r} not in {KINDS}")
        if self.tp < 1 or self.num_src < 1:
            raise ValueError(f"tp/num_src: need >= 1, got {self.tp}/{self.num_src}")
        if self.num_syncs < 1 or self.num_warmup < 0:
            raise ValueError(f"num_syncs: need >= 1 (warm-up >= 0), got {self.num_syncs}")

    @property
    def world_size(self) -> int:
        """Processes in the set."""
        return 2 if self.kind == "grpc" else self.num_src + self.tp

    @property
    def label(self) -> str:
        suffix = "_sampled" if self.check and self.check_samples else ""
        if suffix and self.alternate:
            suffix = "_alternating"
        return f"{self.kind}_tp{self.tp}" + (suffix if self.check else "_nocheck")
