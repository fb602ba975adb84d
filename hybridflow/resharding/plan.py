"""The transfer plan: which source rank sends which slice to which destination rank, in buckets.

``make_plan`` intersects every destination part's region with every source rank's FSDP rows,
vectorised per (destination part, TP size) with numpy, then packs each (source rank ->
destination rank) stream into buckets (see ``buckets.py``) and orders the buckets in a global
schedule. The plan is a table of int64 columns (one row per transfer, sorted by bucket id then
offset); ``Transfer`` objects are views built on demand.

Group ranks: ``0..W-1`` are the source (learner) ranks, then replica 0's TP ranks, replica 1's...

Schedule: bucket ids follow ``(round, seq, src_rank)`` where ``round = (g - src*D // W) mod D``
for the destination's global index ``g`` among ``D`` destination ranks: in each round the
sources talk to distinct destinations. Every rank handles its buckets in increasing id, which
is a single total order shared by all ranks, so blocking point-to-point ops cannot deadlock.

This module knows index arithmetic only: no tensors, no processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from hybridflow.resharding.buckets import assign_buckets
from hybridflow.resharding.plan_types import Bucket, RankRole, Transfer
from hybridflow.resharding.topology import (
    Topology,
    dest_layout,
    part_col_dim,
    part_num_shards,
    part_region,
    validate_replicas,
)

PLAN_VERSION = 1
ALIGN_BYTES = 16
COLUMNS = (
    "src_rank", "replica", "dst_rank", "dest", "part", "source", "row_lo", "row_hi",
    "col_lo", "col_hi", "dst_row", "dst_col", "bucket", "offset", "nbytes",
)  # fmt: skip


class TransferPlan:
    """A computed plan; replayed by the executors at every sync."""

    def __init__(
        self,
        topology: Topology,
        num_src_ranks: int,
        replicas: tuple[int, ...],
        bucket_bytes: int,
        columns: dict[str, np.ndarray],
        bucket_columns: dict[str, np.ndarray],
    ) -> None:
        self.topology = topology
        self.num_src_ranks = num_src_ranks
        self.replicas = replicas
        self.bucket_bytes = bucket_bytes
        self.columns = columns
        self.bucket_columns = bucket_columns
        self._replica_base = np.concatenate([[0], np.cumsum(replicas)]).astype(np.int64)
        self._hash: str | None = None
        self._chunks = np.array(
            [-(-p.shape[0] // num_src_ranks) for p in topology.params], dtype=np.int64
        )

    # ranks ---------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.num_src_ranks + int(self._replica_base[-1])

    def group_rank(self, replica: int, tp_rank: int) -> int:
        if not 0 <= replica < len(self.replicas) or not 0 <= tp_rank < self.replicas[replica]:
            raise ValueError(f"replica/tp_rank: ({replica}, {tp_rank}) not in {self.replicas}")
        return self.num_src_ranks + int(self._replica_base[replica]) + tp_rank

    def role(self, group_rank: int) -> RankRole:
        if not 0 <= group_rank < self.world_size:
            raise ValueError(f"group_rank: {group_rank} not in [0, {self.world_size})")
        if group_rank < self.num_src_ranks:
            return RankRole(group_rank, True, group_rank, -1, -1)
        g = group_rank - self.num_src_ranks
        replica = int(np.searchsorted(self._replica_base, g, side="right")) - 1
        return RankRole(group_rank, False, -1, replica, g - int(self._replica_base[replica]))

    # sizes ---------------------------------------------------------------------------------
    @property
    def num_transfers(self) -> int:
        return len(self.columns["bucket"])

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_columns["nbytes"])

    def bytes_sent(self, src_rank: int) -> int:
        c = self.columns
        return int(c["nbytes"][c["src_rank"] == src_rank].sum())

    def bytes_received(self, replica: int, dst_rank: int) -> int:
        c = self.columns
        mask = (c["replica"] == replica) & (c["dst_rank"] == dst_rank)
        return int(c["nbytes"][mask].sum())

    # views ---------------------------------------------------------------------------------
    def buckets_for(self, group_rank: int) -> np.ndarray:
        """Bucket ids this rank sends (source) or receives (destination), in schedule order."""
        role, b = self.role(group_rank), self.bucket_columns
        if role.is_source:
            return np.flatnonzero(b["src_rank"] == role.src_rank)
        return np.flatnonzero((b["replica"] == role.replica) & (b["dst_rank"] == role.tp_rank))

    def bucket(self, bucket_id: int) -> Bucket:
        b = self.bucket_columns
        return Bucket(
            bucket_id,
            int(b["src_rank"][bucket_id]),
            int(b["replica"][bucket_id]),
            int(b["dst_rank"][bucket_id]),
            int(b["nbytes"][bucket_id]),
            int(b["first"][bucket_id]),
            int(b["first"][bucket_id + 1]),
        )

    def transfer(self, index: int) -> Transfer:
        c = {k: int(v[index]) for k, v in self.columns.items()}
        spec = self.topology.params[c["source"]]
        dest = self.topology.dests[c["dest"]]
        base = min(c["src_rank"] * int(self._chunks[c["source"]]), spec.shape[0])
        cdim = part_col_dim(dest.parts[c["part"]], spec)
        n_rows, n_cols = c["row_hi"] - c["row_lo"], c["col_hi"] - c["col_lo"]
        whole = [(0, d) for d in spec.shape]
        glob, src_local, dst_local = list(whole), list(whole), list(whole)
        glob[0] = (c["row_lo"], c["row_hi"])
        src_local[0] = (c["row_lo"] - base, c["row_hi"] - base)
        dst_local[0] = (c["dst_row"], c["dst_row"] + n_rows)
        if len(spec.shape) > 1:
            glob[cdim] = src_local[cdim] = (c["col_lo"], c["col_hi"])
            dst_local[cdim] = (c["dst_col"], c["dst_col"] + n_cols)
        return Transfer(
            src_rank=c["src_rank"],
            replica=c["replica"],
            dst_rank=c["dst_rank"],
            source=spec.name,
            dest=dest.name,
            global_slice=tuple(glob),
            src_local_slice=tuple(src_local),
            dst_local_slice=tuple(dst_local),
            bucket=c["bucket"],
            offset_bytes=c["offset"],
            num_bytes=c["nbytes"],
        )

    def transfers(self, bucket_id: int | None = None) -> list[Transfer]:
        if bucket_id is None:
            return [self.transfer(i) for i in range(self.num_transfers)]
        b = self.bucket(bucket_id)
        return [self.transfer(i) for i in range(b.first, b.stop)]

    # identity ------------------------------------------------------------------------------
    def content_hash(self) -> str:
        """sha256 over the inputs and every column (little-endian int64)."""
        if self._hash is None:
            h = hashlib.sha256()
            header = f"v{PLAN_VERSION};a{ALIGN_BYTES};W{self.num_src_ranks};R{list(self.replicas)}"
            h.update(f"{header};B{self.bucket_bytes};".encode())
            h.update(self.topology.canonical().encode())
            for cols in (self.columns, self.bucket_columns):
                for name in sorted(cols):
                    h.update(name.encode())
                    h.update(np.ascontiguousarray(cols[name], dtype="<i8").tobytes())
            self._hash = h.hexdigest()
        return self._hash


def make_plan(
    topology: Topology, num_src_ranks: int, replicas: Sequence[int], bucket_bytes: int
) -> TransferPlan:
    """Plan moving FSDP dim-0 shards over ``num_src_ranks`` into each replica's TP layout."""
    if num_src_ranks < 1:
        raise ValueError(f"num_src_ranks: need >= 1, got {num_src_ranks}")
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes: need >= 1, got {bucket_bytes}")
    replicas = tuple(int(t) for t in replicas)
    validate_replicas(topology, replicas)
    templates = {tp: _template(topology, num_src_ranks, tp) for tp in sorted(set(replicas))}
    parts = []
    for r, tp in enumerate(replicas):
        t = dict(templates[tp])
        t["replica"] = np.full(len(t["dst_rank"]), r, dtype=np.int64)
        parts.append(t)
    raw = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.lexsort(
        (raw["row_lo"], raw["part"], raw["dest"], raw["dst_rank"], raw["replica"], raw["src_rank"])
    )
    raw = {k: v[order] for k, v in raw.items()}
    pair_key = (raw["src_rank"] * len(replicas) + raw["replica"]) * max(replicas) + raw["dst_rank"]
    starts = np.flatnonzero(np.diff(pair_key, prepend=-1)).astype(np.int64)
    starts = np.append(starts, len(pair_key))
    ba = assign_buckets(
        starts, raw["row_hi"] - raw["row_lo"], raw["row_bytes"], bucket_bytes, ALIGN_BYTES
    )
    cols = {k: raw[k][ba.orig] for k in raw if k != "row_bytes"}
    cols["row_lo"] = cols["row_lo"] + ba.row_delta
    cols["row_hi"] = cols["row_lo"] + ba.row_count
    cols["dst_row"] = cols["dst_row"] + ba.row_delta
    cols["nbytes"] = ba.row_count * raw["row_bytes"][ba.orig]
    cols["offset"] = ba.offset

    # Global schedule: (round, seq, src_rank). Within a round the sources' buckets interleave,
    # so a destination fed by several sources drains them concurrently.
    first = starts[ba.bucket_pair]
    b_src, b_rep, b_dst = raw["src_rank"][first], raw["replica"][first], raw["dst_rank"][first]
    num_dst = int(sum(replicas))
    g = np.concatenate([[0], np.cumsum(replicas)])[b_rep] + b_dst
    rounds = (g - (b_src * num_dst) // num_src_ranks) % num_dst
    border = np.lexsort((b_src, ba.bucket_seq, rounds))
    new_id = np.empty_like(border)
    new_id[border] = np.arange(len(border))
    cols["bucket"] = new_id[ba.bucket]
    torder = np.lexsort((cols["offset"], cols["bucket"]))
    cols = {k: np.ascontiguousarray(cols[k][torder], dtype=np.int64) for k in COLUMNS}
    ends = cols["offset"] + cols["nbytes"]
    nb = len(border)
    bucket_nbytes = np.zeros(nb, dtype=np.int64)
    np.maximum.at(bucket_nbytes, cols["bucket"], ends)
    bucket_cols = {
        "src_rank": b_src[border],
        "replica": b_rep[border],
        "dst_rank": b_dst[border],
        "nbytes": bucket_nbytes,
        "first": np.searchsorted(cols["bucket"], np.arange(nb + 1)).astype(np.int64),
    }
    return TransferPlan(topology, num_src_ranks, replicas, bucket_bytes, cols, bucket_cols)


def _template(topology: Topology, num_src: int, tp: int) -> dict[str, np.ndarray]:
    """Transfers for one replica of TP size ``tp`` (replica column filled in by the caller)."""
    out: dict[str, list[np.ndarray]] = {k: [] for k in COLUMNS[:12] + ("row_bytes",)}
    out.pop("replica")
    src = np.arange(num_src, dtype=np.int64)
    for di, dest in enumerate(topology.dests):
        _, offsets = dest_layout(topology, dest, tp)
        for pi, part in enumerate(dest.parts):
            si = topology.source_index(part.source)
            spec = topology.params[si]
            d0 = spec.shape[0]
            cdim = part_col_dim(part, spec)  # the dim the col columns address
            ncols = spec.shape[cdim] if len(spec.shape) > 1 else 1
            others = [d for i, d in enumerate(spec.shape) if i not in (0, cdim)]
            inner = spec.itemsize * int(np.prod(others, dtype=np.int64))
            chunk = -(-d0 // num_src)
            s_lo, s_hi = np.minimum(src * chunk, d0), np.minimum((src + 1) * chunk, d0)
            part_num_shards(part, spec, tp)
            regions = [part_region(part, spec, tp, t) for t in range(tp)]
            t_idx = np.arange(tp, dtype=np.int64)[:, None]
            shape = (tp, num_src)
            dim = part.placement.split_dim
            lo = np.broadcast_to(s_lo[None, :], shape)
            hi = np.broadcast_to(s_hi[None, :], shape)
            c_lo = np.zeros(shape, dtype=np.int64)
            c_hi = np.full(shape, ncols, dtype=np.int64)
            dst_row, dst_col = offsets[pi] + lo, 0
            if dim is not None:
                a = np.array([r[0] for r in regions if r], dtype=np.int64)[:, None]
                b = np.array([r[1] for r in regions if r], dtype=np.int64)[:, None]
                if dim == 0:
                    lo, hi = np.maximum(a, lo), np.minimum(b, hi)
                    dst_row = offsets[pi] + lo - a
                else:  # parts concatenate along their split dim: the offset is a column one
                    c_lo, c_hi = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
                    dst_row, dst_col = lo, offsets[pi]
            mask = lo < hi
            n = int(mask.sum())
            for key, val in (
                ("src_rank", np.broadcast_to(src[None, :], shape)),
                ("dst_rank", np.broadcast_to(t_idx, shape)),
                ("row_lo", lo),
                ("row_hi", hi),
                ("col_lo", c_lo),
                ("col_hi", c_hi),
                ("dst_row", dst_row),
                ("row_bytes", (c_hi - c_lo) * inner),
            ):
                out[key].append(np.asarray(val)[mask].astype(np.int64))
            for key, scalar in (("dest", di), ("part", pi), ("source", si), ("dst_col", dst_col)):
                out[key].append(np.full(n, scalar, dtype=np.int64))
    return {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in out.items()}
