"""Batch layout for the learner: validation, right-padded tensors, rank and micro-batch splits.

Sequences are prompt + response, right-padded; position ids count real tokens from 0 (the same
numbering as the rollout engine's left-padded batches). Response token ``j`` of row ``i`` is
predicted by the logits at ``prompt_len[i] + j - 1``; ``response_index`` holds those positions
so log-probs, entropies and values come out as ``[rows, max_response_len]``.

Splits are computed from the global batch alone, so every rank derives the same plan without
talking: each rank takes a contiguous slice, and every rank runs the same number of
micro-batches (a rank short of samples runs a zero-weight filler row, since FSDP collectives
need every rank to run every forward). Nothing here knows about models or losses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hybridflow.types import TrainSample


@dataclass
class PaddedBatch:
    """Right-padded prompt+response tensors of some rows."""

    input_ids: torch.Tensor
    """[rows, seq] token ids, pad id after each row's end."""
    attention_mask: torch.Tensor
    """[rows, seq] 1 on real tokens."""
    position_ids: torch.Tensor
    """[rows, seq] 0-based positions of real tokens (padding clamped)."""
    response_index: torch.Tensor
    """[rows, resp] positions whose logits predict each response token."""
    response_ids: torch.Tensor
    """[rows, resp] response token ids (pad id after each row's end)."""
    response_mask: torch.Tensor
    """[rows, resp] float 1 on real response tokens (all 0 for filler rows)."""


def validate_sequences(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], vocab_size: int
) -> None:
    """Non-empty, equal-count prompt/response lists of in-vocab ids; ValueError naming the bad one."""
    if len(prompts) == 0:
        raise ValueError("batch: no samples")
    if len(prompts) != len(responses):
        raise ValueError(
            f"prompts ({len(prompts)}) and responses ({len(responses)}) differ in count"
        )
    for name, seqs in (("prompt_ids", prompts), ("response_ids", responses)):
        for i, seq in enumerate(seqs):
            if len(seq) == 0:
                raise ValueError(f"samples[{i}].{name}: empty")
            bad = [t for t in seq if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(
                    f"samples[{i}].{name}: token id {bad[0]} outside vocab [0, {vocab_size})"
                )


def validate_samples(samples: Sequence[TrainSample], vocab_size: int) -> None:
    """Checks a train batch; ValueError naming the sample and field."""
    validate_sequences(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], vocab_size
    )
    for i, s in enumerate(samples):
        if not math.isfinite(s.reward):
            raise ValueError(f"samples[{i}].reward: not finite ({s.reward})")
        if len(s.rollout_logprobs) != len(s.response_ids):
            raise ValueError(
                f"samples[{i}].rollout_logprobs: {len(s.rollout_logprobs)} values for "
                f"{len(s.response_ids)} response tokens"
            )
        if not all(math.isfinite(lp) for lp in s.rollout_logprobs):
            raise ValueError(f"samples[{i}].rollout_logprobs: not finite")


def build_padded_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    row_weights: Sequence[float] | None = None,
) -> PaddedBatch:
    """Right-padded tensors for rows ``prompt + response``; ``row_weights`` 0 marks filler rows."""
    rows = len(prompts)
    seq_len = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    resp_len = max(len(r) for r in responses)
    input_ids = torch.full((rows, seq_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, seq_len), dtype=torch.long)
    response_ids = torch.full((rows, resp_len), pad_id, dtype=torch.long)
    response_mask = torch.zeros((rows, resp_len), dtype=torch.float32)
    response_index = torch.zeros((rows, resp_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        n = len(p) + len(r)
        input_ids[i, :n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        attention_mask[i, :n] = 1
        response_ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        weight = 1.0 if row_weights is None else float(row_weights[i])
        response_mask[i, : len(r)] = weight
        # Padded response slots point at the last real position (any valid index would do).
        response_index[i] = torch.clamp(torch.arange(resp_len) + len(p) - 1, max=n - 2)
    position_ids = torch.clamp(attention_mask.cumsum(dim=-1) - 1, min=0)
    return PaddedBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        response_index=response_index.to(device),
        response_ids=response_ids.to(device),
        response_mask=response_mask.to(device),
    )


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
    rank_slices: Sequence[Sequence[int]], rank: int, micro_batch_size: int, filler_index: int
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
