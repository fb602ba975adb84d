"""Which samples each learner rank and micro-batch takes: mini-batches, each rank's slice,
micro-batches by count or by token budget.

Splits are computed from the global batch alone, so every rank derives the same plan without
talking: each rank takes a contiguous slice, and every rank runs the same number of
micro-batches (a rank short of samples runs a zero-weight filler row, since FSDP collectives
need every rank to run every forward). How a micro-batch's rows are laid out is ``batching``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hybridflow.arrays import TokenLike


def split_contiguous(num_items: int, num_parts: int) -> list[range]:
    """``num_parts`` contiguous ranges covering ``range(num_items)``, sizes differing by <= 1."""
    base, extra = divmod(num_items, num_parts)
    out: list[range] = []
    start = 0
    for part in range(num_parts):
        size = base + (1 if part < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


@dataclass
class MicroBatch:
    """Global sample indices of one micro-batch and the weight (1 real, 0 filler) of each row."""

    indices: list[int]
    weights: list[float]


def plan_micro_batches(
    rank_slices: Sequence[TokenLike], rank: int, micro_batch_size: int, filler_index: int
) -> list[MicroBatch]:
    """Micro-batches of ``rank_slices[rank]``, as many on every rank (filler rows pad out)."""
    longest = max(len(s) for s in rank_slices)
    num_micro = max(1, math.ceil(longest / micro_batch_size))
    mine = list(rank_slices[rank])
    plan: list[MicroBatch] = []
    for m in range(num_micro):
        chunk = mine[m * micro_batch_size : (m + 1) * micro_batch_size]
        if chunk:
            plan.append(MicroBatch(indices=chunk, weights=[1.0] * len(chunk)))
        else:
            plan.append(MicroBatch(indices=[filler_index], weights=[0.0]))
    return plan


def plan_token_micro_batches(
    rank_slices: Sequence[TokenLike],
    rank: int,
    lengths: Sequence[int],
    max_tokens: int,
    filler_index: int,
) -> list[MicroBatch]:
    """Micro-batches of ``rank_slices[rank]`` by token budget (``max_tokens_per_micro_batch``):
    consecutive samples while their tokens (``lengths[i]``: prompt + response) sum to at most
    ``max_tokens``, at least one each (a longer sample goes alone); as many micro-batches on
    every rank (filler rows pad out, as in ``plan_micro_batches``)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")

    def groups(indices: Sequence[int]) -> list[list[int]]:
        out: list[list[int]] = []
        used = 0
        for i in indices:
            if out and used + lengths[i] <= max_tokens:
                out[-1].append(i)
                used += lengths[i]
            else:
                out.append([i])
                used = lengths[i]
        return out

    per_rank = [groups([int(i) for i in s]) for s in rank_slices]
    num_micro = max(1, max(len(g) for g in per_rank))
    mine = per_rank[rank]
    plan = [MicroBatch(indices=g, weights=[1.0] * len(g)) for g in mine]
    plan += [
        MicroBatch(indices=[filler_index], weights=[0.0]) for _ in range(num_micro - len(mine))
    ]
    return plan


def plan_step_micro_batches(
    rank_slices: Sequence[TokenLike],
    rank: int,
    micro_batch_size: int,
    filler_index: int,
    lengths: Sequence[int],
    max_tokens: int,
) -> list[MicroBatch]:
    """``plan_token_micro_batches`` when ``max_tokens > 0``, else ``plan_micro_batches``."""
    if max_tokens > 0:
        return plan_token_micro_batches(rank_slices, rank, lengths, max_tokens, filler_index)
    return plan_micro_batches(rank_slices, rank, micro_batch_size, filler_index)


@dataclass
class StepPlan:
    """Mini-batches of the global batch and each rank's contiguous slice of each."""

    mini_batches: list[range]
    rank_slices: list[list[list[int]]]
    """``rank_slices[mini_batch][rank]``: global sample indices."""
    rank: int

    @classmethod
    def build(cls, num_samples: int, num_mini_batches: int, world_size: int, rank: int) -> StepPlan:
        mini_batches = split_contiguous(num_samples, num_mini_batches)
        rank_slices = [
            [[mb.start + j for j in part] for part in split_contiguous(len(mb), world_size)]
            for mb in mini_batches
        ]
        return cls(mini_batches, rank_slices, rank)

    def owned_by_rank(self) -> list[list[int]]:
        """Every rank's samples over all mini-batches."""
        world = len(self.rank_slices[0])
        return [[i for mb in self.rank_slices for i in mb[r]] for r in range(world)]

    @property
    def owned(self) -> list[int]:
        """This rank's samples."""
        return self.owned_by_rank()[self.rank]
