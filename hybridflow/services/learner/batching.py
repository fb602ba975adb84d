"""Batch layout for the learner: validation, and the rows of a micro-batch as tensors (padded,
packed, or one row per prompt).

Sequences are prompt + response, right-padded; position ids count real tokens from 0 (the same
numbering as the rollout engine's left-padded batches). Response token ``j`` of row ``i`` is
predicted by the logits at ``prompt_len[i] + j - 1``; ``response_index`` holds those positions
so log-probs, entropies and values come out as ``[rows, max_response_len]``.

Which samples each rank and micro-batch takes is ``batch_plans``. Nothing here knows about
models or losses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hybridflow.arrays import MaskArray, TokenLike, as_tokens
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
    routed_experts: torch.Tensor | None = None
    """[rows * seq, MoE layers, top_k] expert ids to replay (``learner.moe_router_replay``;
    ``router_replay.batch_routing``), -1 where the router chooses; None: no replay."""
    packed: bool = False
    """The rows' sequences lie back to back in one row (``build_packed_batch``): tensors of
    the model's input are ``[1, tokens]``, ``response_index`` points into that row, and the
    model gets no attention mask (its position ids, restarting at 0, separate the sequences)."""
    shared: bool = False
    """Samples with one prompt share one row (``build_shared_batch``): the prompt once, then
    each sample's response; ``attention_mask`` is ``[input rows, 1, seq, seq]`` bool (True:
    may attend) and ``response_index`` points into the flattened input positions."""

    @property
    def rows(self) -> int:
        """Sequences in the batch (filler rows included)."""
        return int(self.response_ids.shape[0])

    def flat_response_index(self) -> torch.Tensor:
        """``[rows, resp]`` indices into the flattened ``[input rows * seq]`` positions."""
        if self.packed or self.shared:
            return self.response_index
        seq = self.input_ids.shape[1]
        offsets = torch.arange(self.rows, device=self.response_index.device) * seq
        return self.response_index + offsets[:, None]


def validate_sequences(
    prompts: Sequence[TokenLike], responses: Sequence[TokenLike], vocab_size: int
) -> None:
    """Non-empty, equal-count prompt/response lists of in-vocab ids; ValueError naming the bad one."""
    if len(prompts) == 0:
        raise ValueError("batch: no samples")
    if len(prompts) != len(responses):
        raise ValueError(
            f"prompts ({len(prompts)}) and responses ({len(responses)}) differ in count"
        )
    for name, seqs in (("prompt_ids", prompts), ("response_ids", responses)):
        arrays = [as_tokens(s) for s in seqs]
        lengths = np.fromiter((a.size for a in arrays), np.int64, len(arrays))
        empty = np.flatnonzero(lengths == 0)
        if empty.size:
            raise ValueError(f"samples[{empty[0]}].{name}: empty")
        flat = np.concatenate(arrays)
        bad = np.flatnonzero((flat < 0) | (flat >= vocab_size))
        if bad.size:
            row = int(np.searchsorted(np.cumsum(lengths), bad[0], side="right"))
            raise ValueError(
                f"samples[{row}].{name}: token id {int(flat[bad[0]])} outside vocab [0, {vocab_size})"
            )


def validate_samples(samples: Sequence[TrainSample], vocab_size: int) -> None:
    """Checks a train batch; ValueError naming the sample and field."""
    validate_sequences(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], vocab_size
    )
    for i, s in enumerate(samples):
        if not math.isfinite(s.reward):
            raise ValueError(f"samples[{i}].reward: not finite ({s.reward})")
        if s.baseline is not None and not math.isfinite(s.baseline):
            raise ValueError(f"samples[{i}].baseline: not finite ({s.baseline})")
        if len(s.rollout_logprobs) != len(s.response_ids):
            raise ValueError(
                f"samples[{i}].rollout_logprobs: {len(s.rollout_logprobs)} values for "
                f"{len(s.response_ids)} response tokens"
            )
    finite = np.isfinite(np.concatenate([s.rollout_logprobs for s in samples]))
    if not finite.all():
        lengths = np.cumsum([s.rollout_logprobs.size for s in samples])
        row = int(np.searchsorted(lengths, np.flatnonzero(~finite)[0], side="right"))
        raise ValueError(f"samples[{row}].rollout_logprobs: not finite")


def build_padded_batch(
    prompts: Sequence[TokenLike],
    responses: Sequence[TokenLike],
    pad_id: int,
    device: torch.device,
    row_weights: Sequence[float] | None = None,
    loss_masks: Sequence[MaskArray | None] | None = None,
) -> PaddedBatch:
    """Right-padded tensors for rows ``prompt + response``; ``row_weights`` 0 marks filler rows;
    ``loss_masks`` (multi-turn, one per row or None) zero the ``response_mask`` on the
    response tokens the policy did not sample."""
    rows = len(prompts)
    prompt_arrays = [as_tokens(p) for p in prompts]
    response_arrays = [as_tokens(r) for r in responses]
    prompt_len = np.fromiter((p.size for p in prompt_arrays), np.int64, rows)
    response_len = np.fromiter((r.size for r in response_arrays), np.int64, len(response_arrays))
    if response_len.size != rows:
        raise ValueError(f"{rows} prompts but {response_len.size} responses")
    total = prompt_len + response_len
    seq_len, resp_len = int(total.max()), int(response_len.max())
    input_ids = np.full((rows, seq_len), pad_id, dtype=np.int64)
    for i, (p, r) in enumerate(zip(prompt_arrays, response_arrays)):
        input_ids[i, : p.size] = p
        input_ids[i, p.size : p.size + r.size] = r
    attention_mask = np.arange(seq_len)[None, :] < total[:, None]
    response_ids, response_mask = _response_tensors(
        response_arrays, pad_id, device, row_weights, loss_masks
    )
    # Padded response slots point at the last real position (any valid index would do).
    response_index = np.minimum(
        np.arange(resp_len)[None, :] + prompt_len[:, None] - 1, (total - 2)[:, None]
    )
    position_ids = np.maximum(np.cumsum(attention_mask, axis=-1) - 1, 0)
    return PaddedBatch(
        input_ids=torch.from_numpy(input_ids).to(device),
        attention_mask=torch.from_numpy(attention_mask.astype(np.int64)).to(device),
        position_ids=torch.from_numpy(position_ids.astype(np.int64)).to(device),
        response_index=torch.from_numpy(response_index.astype(np.int64)).to(device),
        response_ids=response_ids,
        response_mask=response_mask,
    )


def _response_tensors(
    responses: Sequence[np.ndarray],
    pad_id: int,
    device: torch.device,
    row_weights: Sequence[float] | None,
    loss_masks: Sequence[MaskArray | None] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(response_ids, response_mask)``, ``[rows, longest response]``: the ids right-padded
    with ``pad_id``; the mask 1 on real tokens times the row's weight, times its loss mask."""
    rows = len(responses)
    lengths = np.fromiter((r.size for r in responses), np.int64, rows)
    width = int(lengths.max())
    response_ids = np.full((rows, width), pad_id, dtype=np.int64)
    for i, r in enumerate(responses):
        response_ids[i, : r.size] = r
    weights = (
        np.ones(rows, dtype=np.float32)
        if row_weights is None
        else np.asarray(row_weights, dtype=np.float32)
    )
    response_mask = (np.arange(width)[None, :] < lengths[:, None]) * weights[:, None]
    for i, flags in enumerate(loss_masks or ()):
        if flags is not None:
            response_mask[i, : flags.size] *= flags
    return (
        torch.from_numpy(response_ids).to(device),
        torch.from_numpy(response_mask.astype(np.float32)).to(device),
    )


def build_packed_batch(
    prompts: Sequence[TokenLike],
    responses: Sequence[TokenLike],
    pad_id: int,
    device: torch.device,
    row_weights: Sequence[float] | None = None,
    loss_masks: Sequence[MaskArray | None] | None = None,
) -> PaddedBatch:
    """The sequences ``prompt + response`` concatenated into one row with no padding, position
    ids restarting at 0 for each; response tensors stay ``[rows, resp]`` as in
    ``build_padded_batch`` (same ``response_ids`` and ``response_mask``), with
    ``response_index`` pointing into the packed row."""
    padded = build_padded_batch(prompts, responses, pad_id, device, row_weights, loss_masks)
    lengths = padded.attention_mask.sum(-1)
    starts = torch.cumsum(lengths, 0) - lengths
    real = padded.attention_mask.bool()
    return PaddedBatch(
        input_ids=padded.input_ids[real].unsqueeze(0),
        attention_mask=torch.ones((1, int(lengths.sum())), dtype=torch.int64, device=device),
        position_ids=padded.position_ids[real].unsqueeze(0),
        response_index=padded.response_index + starts[:, None],
        response_ids=padded.response_ids,
        response_mask=padded.response_mask,
        packed=True,
    )


def build_shared_batch(
    prompts: Sequence[TokenLike],
    responses: Sequence[TokenLike],
    pad_id: int,
    device: torch.device,
    row_weights: Sequence[float] | None = None,
    loss_masks: Sequence[MaskArray | None] | None = None,
) -> PaddedBatch:
    """One input row per distinct prompt: the prompt once, then the response of every sample
    with that prompt, back to back, rows right-padded. Each response token sees the prompt
    and its own response's earlier tokens (the 4-D ``attention_mask``), at the positions it
    has in its own sequence, so every log-prob is the one ``build_padded_batch`` gives while a
    GRPO group's prompt runs once instead of once per sample. Response tensors stay
    ``[samples, resp]`` in the samples' order, as in ``build_padded_batch``."""
    prompt_arrays = [as_tokens(p) for p in prompts]
    response_arrays = [as_tokens(r) for r in responses]
    response_ids, response_mask = _response_tensors(
        response_arrays, pad_id, device, row_weights, loss_masks
    )
    members = _prompt_groups(prompt_arrays)
    lengths = _shared_row_lengths(prompt_arrays, response_arrays, members)
    seq_len, resp_len = max(lengths), int(response_ids.shape[1])
    input_ids = np.full((len(members), seq_len), pad_id, dtype=np.int64)
    position_ids = np.zeros((len(members), seq_len), dtype=np.int64)
    segment = np.full((len(members), seq_len), -1, dtype=np.int64)  # 0 prompt, 1+ responses
    response_index = np.zeros((len(prompt_arrays), resp_len), dtype=np.int64)
    for row, m in enumerate(members):
        prompt = prompt_arrays[m[0]]
        input_ids[row, : prompt.size] = prompt
        position_ids[row, : prompt.size] = np.arange(prompt.size)
        segment[row, : prompt.size] = 0
        start = prompt.size
        for k, i in enumerate(m, start=1):
            r = response_arrays[i]
            end = start + r.size
            input_ids[row, start:end] = r
            position_ids[row, start:end] = np.arange(prompt.size, prompt.size + r.size)
            segment[row, start:end] = k
            # token 0 is predicted at the prompt's last position, token j at start + j - 1;
            # padded slots point at the response's last token (any valid index would do)
            own = np.minimum(np.arange(start - 1, start + resp_len - 1), end - 1)
            own[0] = prompt.size - 1
            response_index[i] = row * seq_len + own
            start = end
    keys, queries = segment[:, None, :], segment[:, :, None]
    causal = np.tril(np.ones((seq_len, seq_len), dtype=bool))[None]
    mask = causal & (keys >= 0) & (queries >= 0) & ((keys == 0) | (keys == queries))
    mask |= np.eye(seq_len, dtype=bool)[None]  # a padding position sees itself: no empty row
    return PaddedBatch(
        input_ids=torch.from_numpy(input_ids).to(device),
        attention_mask=torch.from_numpy(mask[:, None]).to(device),
        position_ids=torch.from_numpy(position_ids).to(device),
        response_index=torch.from_numpy(response_index).to(device),
        response_ids=response_ids,
        response_mask=response_mask,
        shared=True,
    )


def _prompt_groups(prompts: Sequence[np.ndarray]) -> list[list[int]]:
    """Indices of the samples with each distinct prompt, in first-seen order."""
    groups: dict[bytes, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p.astype(np.int64).tobytes(), []).append(i)
    return list(groups.values())


def _shared_row_lengths(
    prompts: Sequence[np.ndarray], responses: Sequence[np.ndarray], groups: list[list[int]]
) -> list[int]:
    """Each shared row's length: its prompt once plus all its samples' responses."""
    return [prompts[g[0]].size + sum(responses[i].size for i in g) for g in groups]


@dataclass(frozen=True)
class PromptSharing:
    """When ``build_batch`` lays a micro-batch out with shared prompts
    (``learner.memory.shared_prompts``; the worker builds it from its models)."""

    max_len: int
    """The longest sequence a shared row may hold a sample of: the model's sliding window
    (the 4-D mask replaces the model's own), else unbounded."""
    hidden_size: int
    """The model's width, which weighs its linear layers' work per position against the
    attention's per pair of positions (``cost``)."""

    def cost(self, row_lengths: Sequence[int]) -> int:
        """A layout's work in a decoder layer, up to a constant, padding included: each
        position's linear layers (weighed as 10 × width, for about 10 × width times the
        attention's multiply-adds per pair, counting the MLP's usual widths) plus the
        attention's pairs of positions."""
        longest = max(row_lengths)
        return len(row_lengths) * (longest * 10 * self.hidden_size + longest * longest)

    def pays(self, prompts: Sequence[TokenLike], responses: Sequence[TokenLike]) -> bool:
        """Whether shared rows do less work than one padded row per sample: some samples
        share a prompt, none is longer than ``max_len``, and the longer rows' attention does
        not eat the positions saved (long responses after a short prompt)."""
        prompt_arrays = [as_tokens(p) for p in prompts]
        response_arrays = [as_tokens(r) for r in responses]
        lengths = [p.size + r.size for p, r in zip(prompt_arrays, response_arrays)]
        if max(lengths) > self.max_len:
            return False
        groups = _prompt_groups(prompt_arrays)
        if len(groups) == len(lengths):
            return False
        shared = _shared_row_lengths(prompt_arrays, response_arrays, groups)
        return self.cost(shared) < self.cost(lengths)


def build_batch(
    prompts: Sequence[TokenLike],
    responses: Sequence[TokenLike],
    pad_id: int,
    device: torch.device,
    row_weights: Sequence[float] | None = None,
    packed: bool = False,
    loss_masks: Sequence[MaskArray | None] | None = None,
    sharing: PromptSharing | None = None,
) -> PaddedBatch:
    """``build_packed_batch`` when ``packed`` (``learner.memory.packing``); else
    ``build_shared_batch`` where ``sharing`` says it pays; else padded."""
    if packed:
        return build_packed_batch(prompts, responses, pad_id, device, row_weights, loss_masks)
    if sharing is not None and sharing.pays(prompts, responses):
        return build_shared_batch(prompts, responses, pad_id, device, row_weights, loss_masks)
    return build_padded_batch(prompts, responses, pad_id, device, row_weights, loss_masks)
