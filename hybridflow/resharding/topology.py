"""Shared topology: which parameters exist, how the learner holds them, how replicas want them.

Source side: every parameter is sharded along dim 0 over the ``W`` learner ranks exactly as
torch's FSDP2 ``fully_shard`` does it (``_chunk_with_empty`` in
``torch/distributed/fsdp/_fully_shard/_fsdp_common.py``: ``torch.chunk`` then empty chunks).
Rank ``r`` holds rows ``[min(r*c, d0), min((r+1)*c, d0))`` with ``c = ceil(d0 / W)``; trailing
ranks may hold fewer rows or none.

Destination side: a destination parameter lives on every rank of a replica's tensor-parallel
mesh of size ``T``. It is built from one or more source parameters (*parts*); each part is split
over the mesh by its placement and the local pieces are concatenated along the parts' split dim
(dim 0 when whole: vLLM's fused ``qkv_proj`` = ``cat([q_t, k_t, v_t])``, ``gate_up_proj`` =
``cat([gate_t, up_t])``). Expert tensors ``(experts, out, in)`` split their dim 1 or 2 (vLLM's
FusedMoE at TP: every rank holds every expert, a slice of each); a part may be one *block* of
its source along the split dim, so the gate and up halves of a fused ``(experts, 2*I, hidden)``
tensor are two parts of one destination (``w13 = cat([gate_t, up_t], dim=1)``). Expert
parallelism (experts split over ranks) is a column split of dim 0.
Splits are even: the split dim must be divisible by the number of shards (vocab-parallel included:
vLLM's padding of the vocabulary to a multiple of 64 is not modelled; a padded destination
simply receives into its first rows).

This module is pure: it knows shapes and index ranges, never tensors, devices or ranks' transports.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

Range = tuple[int, int]


class Placement(str, enum.Enum):
    """How one part of a destination parameter is laid out over a TP mesh."""

    COLUMN = "column"  # dim 0 split evenly (ColumnParallelLinear)
    ROW = "row"  # dim 1 split evenly (RowParallelLinear)
    VOCAB = "vocab"  # dim 0 split evenly (VocabParallelEmbedding / ParallelLMHead, unpadded)
    REPLICATED = "replicated"  # every TP rank holds the whole tensor
    EXPERT_COLUMN = "expert_column"  # dim 1 of (experts, out, in) split (FusedMoE w13)
    EXPERT_ROW = "expert_row"  # dim 2 of (experts, out, in) split (FusedMoE w2)

    @property
    def split_dim(self) -> int | None:
        """The dimension split over the mesh, or None when replicated."""
        return _SPLIT_DIMS[self.value]


_SPLIT_DIMS: dict[str, int | None] = {
    "column": 0,
    "row": 1,
    "vocab": 0,
    "replicated": None,
    "expert_column": 1,
    "expert_row": 2,
}


@dataclass(frozen=True)
class ParamSpec:
    """One learner parameter as it appears in the learner's (HF) state dict."""

    name: str
    """State-dict name, e.g. ``model.layers.0.self_attn.q_proj.weight``."""
    shape: tuple[int, ...]
    """Global (unsharded) shape; at least one dimension."""
    dtype: str = "float32"
    """torch dtype name without the ``torch.`` prefix, e.g. ``bfloat16``."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ParamSpec.name: must be non-empty")
        if len(self.shape) < 1 or any(int(d) < 1 for d in self.shape):
            raise ValueError(
                f"ParamSpec.shape: {self.name} has shape {self.shape}; need ndim >= 1, dims >= 1"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"ParamSpec.dtype: {self.name} has unknown dtype {self.dtype!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def num_bytes(self) -> int:
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class DestPart:
    """One source parameter's contribution to a destination parameter."""

    source: str
    """Name of the source ParamSpec."""
    placement: Placement
    """How this source is split over the TP mesh."""
    max_shards: int | None = None
    """At most this many distinct shards (e.g. ``num_kv_heads``): with ``T > max_shards`` each
    shard is replicated on ``T // max_shards`` consecutive TP ranks, as vLLM does for KV heads.
    None: always ``T`` shards."""
    block: int = 0
    """Which of ``num_blocks`` equal blocks of the source along the split dim this part is
    (0: gate, 1: up of a fused gate_up tensor); each block is split over the mesh on its own."""
    num_blocks: int = 1
    """Equal blocks the source's split dim consists of (1: the whole dim)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", Placement(self.placement))
        if self.max_shards is not None and self.max_shards < 1:
            raise ValueError(f"DestPart.max_shards: {self.source} has {self.max_shards}; need >= 1")
        if self.num_blocks < 1 or not 0 <= self.block < self.num_blocks:
            raise ValueError(
                f"DestPart.block: {self.source} has block {self.block} of {self.num_blocks}"
            )
        if self.num_blocks > 1 and self.placement.split_dim is None:
            raise ValueError(f"DestPart.num_blocks: {self.source} is replicated, not split")


@dataclass(frozen=True)
class DestParam:
    """A parameter of the rollout engine: its parts' local pieces concatenated along their
    split dim (``concat_dim``)."""

    name: str
    """The engine's parameter name, e.g. ``model.layers.0.self_attn.qkv_proj.weight``."""
    parts: tuple[DestPart, ...]
    """Ordered sources; one part for an unfused parameter."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))
        if not self.parts:
            raise ValueError(f"DestParam.parts: {self.name} has no parts")
        if len({_concat_dim(p) for p in self.parts}) > 1:
            raise ValueError(f"DestParam.parts: {self.name} mixes parts split on different dims")

    @property
    def concat_dim(self) -> int:
        """The dim its parts' local pieces are concatenated along."""
        return _concat_dim(self.parts[0])


def _concat_dim(part: DestPart) -> int:
    dim = part.placement.split_dim
    return 0 if dim is None else dim


@dataclass(frozen=True)
class Topology:
    """The learner's parameters and the engine's parameters built from them."""

    params: tuple[ParamSpec, ...]
    """Source parameters in the learner's order."""
    dests: tuple[DestParam, ...]
    """Destination parameters in the engine's order."""
    _index: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "dests", tuple(self.dests))
        for i, p in enumerate(self.params):
            if p.name in self._index:
                raise ValueError(f"Topology.params: duplicate name {p.name}")
            self._index[p.name] = i
        seen: set[str] = set()
        for d in self.dests:
            if d.name in seen:
                raise ValueError(f"Topology.dests: duplicate name {d.name}")
            seen.add(d.name)
            for part in d.parts:
                spec = self.params[self.source_index(part.source)]
                dim = part.placement.split_dim
                if dim is not None and dim >= len(spec.shape):
                    raise ValueError(
                        f"Topology.dests: {d.name} splits {spec.name} on dim {dim}, "
                        f"which has shape {spec.shape}"
                    )
            first = self.params[self.source_index(d.parts[0].source)]
            for part in d.parts[1:]:
                spec = self.params[self.source_index(part.source)]
                if spec.dtype != first.dtype or len(spec.shape) != len(first.shape):
                    raise ValueError(
                        f"Topology.dests: parts of {d.name} differ in dtype or ndim "
                        f"({first.name} vs {spec.name})"
                    )

    def source_index(self, name: str) -> int:
        if name not in self._index:
            raise ValueError(f"Topology.dests: unknown source parameter {name!r}")
        return self._index[name]

    def param(self, name: str) -> ParamSpec:
        return self.params[self.source_index(name)]

    @property
    def num_bytes(self) -> int:
        """Bytes of the full (unsharded) source model."""
        return sum(p.num_bytes for p in self.params)

    def canonical(self) -> str:
        """A canonical JSON form (hashed into the plan)."""
        return json.dumps(
            {
                "params": [[p.name, list(p.shape), p.dtype] for p in self.params],
                "dests": [[d.name, [_canonical_part(q) for q in d.parts]] for d in self.dests],
            },
            separators=(",", ":"),
        )


def _canonical_part(part: DestPart) -> list[object]:
    row: list[object] = [part.source, part.placement.value, part.max_shards]
    return row + [part.block, part.num_blocks] if part.num_blocks > 1 else row


def fsdp_dim0_rows(num_rows: int, num_ranks: int) -> list[Range]:
    """Rows ``[start, stop)`` each of ``num_ranks`` FSDP2 ranks holds of a ``num_rows`` dim 0."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks: need >= 1, got {num_ranks}")
    chunk = -(-num_rows // num_ranks)
    return [(min(r * chunk, num_rows), min((r + 1) * chunk, num_rows)) for r in range(num_ranks)]


def part_num_shards(part: DestPart, spec: ParamSpec, tp_size: int) -> int:
    """Distinct shards of ``part`` on a TP mesh of ``tp_size``; validates divisibility."""
    dim = part.placement.split_dim
    if dim is None:
        return 1
    num = tp_size
    if part.max_shards is not None and tp_size > part.max_shards:
        if tp_size % part.max_shards:
            raise ValueError(
                f"replicas: tp size {tp_size} is not a multiple of max_shards "
                f"{part.max_shards} of {spec.name}"
            )
        num = part.max_shards
    if part.max_shards is not None and part.max_shards % num:
        raise ValueError(
            f"replicas: tp size {tp_size} does not divide max_shards {part.max_shards} of {spec.name}"
        )
    if spec.shape[dim] % (num * part.num_blocks):
        raise ValueError(
            f"replicas: tp size {tp_size} needs dim {dim} of {spec.name} ({spec.shape[dim]}) "
            f"divisible into {num} shards"
            + (f" of each of {part.num_blocks} blocks" if part.num_blocks > 1 else "")
        )
    return num


def part_region(part: DestPart, spec: ParamSpec, tp_size: int, tp_rank: int) -> Range | None:
    """Global ``[start, stop)`` along the split dim held by ``tp_rank``; None if replicated."""
    dim = part.placement.split_dim
    if dim is None:
        return None
    num = part_num_shards(part, spec, tp_size)
    block = spec.shape[dim] // part.num_blocks
    size = block // num
    start = part.block * block + (tp_rank // (tp_size // num)) * size
    return start, start + size


def part_local_shape(part: DestPart, spec: ParamSpec, tp_size: int) -> tuple[int, ...]:
    dim = part.placement.split_dim
    shape = list(spec.shape)
    if dim is not None:
        shape[dim] //= part_num_shards(part, spec, tp_size) * part.num_blocks
    return tuple(shape)


def part_col_dim(part: DestPart, spec: ParamSpec) -> int:
    """The dim beyond 0 a plan's column ranges address for ``part``: its split dim when that
    is not 0, else dim 1 (whole). Dims other than 0 and this one always travel whole."""
    dim = part.placement.split_dim
    return dim if dim is not None and dim > 0 else min(1, len(spec.shape) - 1)


def dest_layout(
    topology: Topology, dest: DestParam, tp_size: int
) -> tuple[tuple[int, ...], list[int]]:
    """Local shape of ``dest`` on a TP mesh of ``tp_size`` and each part's offset in it along
    ``dest.concat_dim``."""
    shapes = [part_local_shape(p, topology.param(p.source), tp_size) for p in dest.parts]
    cat = dest.concat_dim
    for s in shapes[1:]:
        if s[:cat] + s[cat + 1 :] != shapes[0][:cat] + shapes[0][cat + 1 :]:
            raise ValueError(
                f"replicas: parts of {dest.name} have local shapes {shapes} at tp size "
                f"{tp_size}; they must agree beyond dim {cat} to concatenate"
            )
    offsets = [0]
    for s in shapes:
        offsets.append(offsets[-1] + s[cat])
    shape = list(shapes[0])
    shape[cat] = offsets[-1]
    return tuple(shape), offsets[:-1]


def part_slices(
    topology: Topology, dest: DestParam, part_index: int, tp_size: int, tp_rank: int
) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """(slices of the full source tensor, slices of the local dest tensor) for one part."""
    part = dest.parts[part_index]
    spec = topology.param(part.source)
    shape, offsets = dest_layout(topology, dest, tp_size)
    local = part_local_shape(part, spec, tp_size)
    src = [slice(0, d) for d in spec.shape]
    region = part_region(part, spec, tp_size, tp_rank)
    if region is not None:
        src[part.placement.split_dim or 0] = slice(*region)
    dst = [slice(0, d) for d in shape]
    cat = dest.concat_dim
    dst[cat] = slice(offsets[part_index], offsets[part_index] + local[cat])
    return tuple(src), tuple(dst)


def validate_replicas(topology: Topology, replicas: Sequence[int]) -> None:
    """Raise ValueError naming the problem if some replica's TP size cannot hold the topology."""
    if not replicas:
        raise ValueError("replicas: need at least one replica")
    for i, tp in enumerate(replicas):
        if int(tp) < 1:
            raise ValueError(f"replicas[{i}]: tp size must be >= 1, got {tp}")
    for tp in sorted(set(int(t) for t in replicas)):
        for dest in topology.dests:
            dest_layout(topology, dest, tp)
