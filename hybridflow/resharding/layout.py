"""A replica's weight layout: what the weight-sync handshake says about how it holds weights.

At join the planner assumes every replica places each learner parameter the way the
learner's own family registry entry says (``Topology``). A replica that places them otherwise
(another family, another config, a vLLM whose layout moved) would receive slices that do not
fit, or worse, slices that fit but mean something else. So each replica reports its layout,
computed from the model it loaded: its family name and, per learner parameter, the global
shape, the placement kind and axis, the blocks and the destination it is fused into. The
learner computes the same from its own registry entry and refuses at join, naming the first
parameter that differs. A replica with no family (the ``hf`` engine) reports whole tensors.

Pure: names, shapes and placements only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from hybridflow.resharding.topology import Topology


@dataclass(frozen=True)
class ParamLayout:
    """How one learner parameter is placed on a replica's tensor-parallel mesh."""

    name: str
    """The learner's (Hugging Face) parameter name."""
    shape: tuple[int, ...]
    """Its global (unsharded) shape."""
    placement: str
    """``Placement`` value: column, row, vocab, replicated, expert_column, expert_row."""
    split_dim: int
    """The dim split over the mesh; -1 when replicated."""
    num_blocks: int
    """Equal blocks along the split dim, each split on its own (2: gate and up)."""
    max_shards: int
    """At most this many distinct shards (KV heads); 0: no bound."""
    dest: str
    """The replica's tensor it goes into (fused ones hold several parameters)."""

    def describe(self) -> str:
        blocks = f" in {self.num_blocks} blocks" if self.num_blocks > 1 else ""
        bound = f", at most {self.max_shards} shards" if self.max_shards else ""
        return (
            f"{self.shape} {self.placement} (dim {self.split_dim}{blocks}{bound}) into {self.dest}"
        )


@dataclass(frozen=True)
class ReplicaLayout:
    """A replica's family and the placement of every learner parameter, sorted by name."""

    family: str
    """The model family (``config.model_type``) whose layout it follows; "" for whole
    tensors under the learner's own names (the ``hf`` engine)."""
    params: tuple[ParamLayout, ...]
    """One entry per learner parameter, sorted by name."""
    dtype: str = ""
    """The dtype the replica holds the weights in, which a weight sync sends them in (the
    learner casts); "" unknown (the learner's own). Not part of the placement compared at
    join or of the digest."""

    def digest(self) -> str:
        """sha256 over the family and every entry (what a log line shows)."""
        rows = [[p.name, list(p.shape), p.placement, p.split_dim, p.num_blocks,
                 p.max_shards, p.dest] for p in self.params]  # fmt: skip
        text = json.dumps([self.family, rows], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def layout_of(family: str, topology: Topology) -> ReplicaLayout:
    """The layout ``topology`` places its parameters in (a parameter in several parts of
    one destination, as blocks, is one entry)."""
    entries: dict[str, ParamLayout] = {}
    for dest in topology.dests:
        for part in dest.parts:
            spec = topology.param(part.source)
            dim = part.placement.split_dim
            entries[part.source] = ParamLayout(
                name=spec.name,
                shape=spec.shape,
                placement=part.placement.value,
                split_dim=-1 if dim is None else dim,
                num_blocks=part.num_blocks,
                max_shards=part.max_shards or 0,
                dest=dest.name,
            )
    dtypes = {p.dtype for p in topology.params}
    dtype = dtypes.pop() if len(dtypes) == 1 else ""
    return ReplicaLayout(family, tuple(entries[n] for n in sorted(entries)), dtype)


def check_same_layout(expected: ReplicaLayout, reported: ReplicaLayout, replica: str) -> None:
    """ValueError naming how ``replica``'s reported layout differs from the expected one:
    the families, else the first parameter only one side has or that differs."""
    if reported.family != expected.family:
        raise ValueError(
            f"replica {replica} holds family {reported.family or 'none (whole tensors)'!r} "
            f"(layout {reported.digest()[:12]}), the learner's model is "
            f"{expected.family or 'none (whole tensors)'!r} (layout {expected.digest()[:12]})"
        )
    mine = {p.name: p for p in expected.params}
    theirs = {p.name: p for p in reported.params}
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) == theirs.get(name):
            continue
        ours = mine[name].describe() if name in mine else "not held by the learner"
        its = theirs[name].describe() if name in theirs else "not held by the replica"
        raise ValueError(
            f"replica {replica} places {name!r} as {its}; the learner's {expected.family or 'whole-tensor'} "
            f"layout says {ours} (layouts {reported.digest()[:12]} vs {expected.digest()[:12]})"
        )
