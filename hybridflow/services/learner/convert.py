"""Proto ↔ domain conversions of the learner service."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hybridflow.rpc import wire
from hybridflow.rpc.codec import (
    check_ids,
    pack_floats,
    split_by,
    token_buffer,
    unpack_floats,
)
from hybridflow.rpc.routing import pack_routed, unpack_routed
from hybridflow.types import LearnerInfo, TrainSample, TrainStepResult
from hybridflow.v1 import learner_pb2


def batch_pieces(
    samples: Sequence[TrainSample],
    start_version: int | None = None,
    publish_to: Sequence[str] = (),
) -> list[wire.Piece]:
    """A serialized ``TrainBatch`` as pieces over the samples' own arrays (see rpc/wire.py):
    what the client streams, with the token and log-prob bytes copied once, into chunks.
    ``start_version`` and ``publish_to``: a step sent ahead (``TrainBatch``'s fields)."""
    rest = learner_pb2.TrainBatch(
        rewards=pack_floats(np.fromiter((s.reward for s in samples), np.float32, len(samples))),
        group_ids=[s.group_id for s in samples],
        policy_versions=[s.policy_version for s in samples],
        publish_to=list(publish_to),
    )
    if start_version is not None:
        rest.start_version = start_version
    if any(s.baseline is not None for s in samples):
        rest.baselines.CopyFrom(pack_floats(_baselines_with_nan(samples)))
    if any(s.routed_experts is not None for s in samples):
        rest.routed_experts.CopyFrom(pack_routed([s.routed_experts for s in samples]))
    if any(s.loss_mask is not None for s in samples):
        rest.loss_masks = _loss_masks(samples)
    if any(s.turn_rewards is not None for s in samples):
        rest.turn_rewards.CopyFrom(pack_floats(_turn_rewards_with_nan(samples)))
    fields = learner_pb2.TrainBatch
    return [
        *wire.bytes_field(
            fields.PROMPTS_FIELD_NUMBER, wire.token_batch([s.prompt_ids for s in samples])
        ),
        *wire.bytes_field(
            fields.RESPONSES_FIELD_NUMBER, wire.token_batch([s.response_ids for s in samples])
        ),
        *wire.bytes_field(
            fields.ROLLOUT_LOGPROBS_FIELD_NUMBER,
            wire.float_tensor([s.rollout_logprobs for s in samples]),
        ),
        wire.message_piece(rest),
    ]


def _loss_masks(samples: Sequence[TrainSample]) -> bytes:
    """Every sample's 0/1 flags back to back (all 1 for a sample without a mask)."""
    return b"".join(
        s.loss_mask.tobytes() if s.loss_mask is not None else b"\x01" * len(s.response_ids)
        for s in samples
    )


def _turn_rewards_with_nan(samples: Sequence[TrainSample]) -> np.ndarray:
    """Every sample's per-turn rewards back to back, NaN for a sample without them."""
    return np.concatenate(
        [
            s.turn_rewards
            if s.turn_rewards is not None
            else np.full(len(s.response_ids), np.nan, dtype=np.float32)
            for s in samples
        ]
    )


def _turn_rewards_from_proto(
    msg: learner_pb2.TrainBatch, offsets: np.ndarray
) -> list[np.ndarray | None]:
    n = offsets.size - 1
    if not msg.HasField("turn_rewards"):
        return [None] * n
    values = unpack_floats(msg.turn_rewards, "batch.turn_rewards", int(offsets[-1]))
    out: list[np.ndarray | None] = []
    for i, part in enumerate(split_by(values, offsets)):
        nan = np.isnan(part)
        if nan.all() and part.size:
            out.append(None)
        elif nan.any() or np.isinf(part).any():
            raise ValueError(f"batch.turn_rewards of sample {i}: not finite")
        else:
            out.append(part)
    return out


def _loss_masks_from_proto(
    msg: learner_pb2.TrainBatch, offsets: np.ndarray
) -> list[np.ndarray | None]:
    """Per sample its loss mask (a view over the message), None for all when the field is
    empty; ValueError when the flags do not cover the responses or are not 0/1."""
    n = offsets.size - 1
    if not msg.loss_masks:
        return [None] * n
    flags = np.frombuffer(msg.loss_masks, dtype=np.uint8)
    if flags.size != int(offsets[-1]):
        raise ValueError(
            f"batch.loss_masks: {flags.size} flags for {int(offsets[-1])} response tokens"
        )
    if flags.size and flags.max() > 1:
        raise ValueError("batch.loss_masks: flags must be 0 or 1")
    return list(split_by(flags, offsets))


def _baselines_with_nan(samples: Sequence[TrainSample]) -> np.ndarray:
    """One float32 per sample, NaN for "no baseline" (the wire's marker, so a real baseline
    must be finite)."""
    out = np.full(len(samples), np.nan, dtype=np.float32)
    for i, s in enumerate(samples):
        if s.baseline is not None:
            if not np.isfinite(s.baseline):
                raise ValueError(f"samples[{i}].baseline is not finite ({s.baseline})")
            out[i] = s.baseline
    return out


def _baselines_from_proto(msg: learner_pb2.TrainBatch, n: int) -> list[float | None]:
    """Per sample its baseline, None where the wire holds NaN or the field is unset."""
    if not msg.HasField("baselines"):
        return [None] * n
    values = unpack_floats(msg.baselines, "batch.baselines", n)
    bad = np.flatnonzero(np.isinf(values))
    if bad.size:
        raise ValueError(f"batch.baselines[{bad[0]}] is not finite ({values[bad[0]]})")
    return [None if math.isnan(v) else v for v in values.tolist()]


def batch_to_proto(samples: Sequence[TrainSample]) -> learner_pb2.TrainBatch:
    """The same batch as a message (tests, tools); the client streams ``batch_pieces``."""
    return learner_pb2.TrainBatch.FromString(b"".join(batch_pieces(samples)))


def batch_from_proto(
    msg: learner_pb2.TrainBatch, vocab_size: int | None = None
) -> list[TrainSample]:
    """Samples whose arrays are views over the message's bytes; the per-token checks (token
    ids inside ``vocab_size`` when given, finite rewards) run once over the whole batch."""
    prompt_flat, prompt_offsets = token_buffer(msg.prompts, "batch.prompts")
    response_flat, response_offsets = token_buffer(msg.responses, "batch.responses")
    if vocab_size is not None:
        check_ids(prompt_flat, prompt_offsets, vocab_size, "batch.prompts")
        check_ids(response_flat, response_offsets, vocab_size, "batch.responses")
    n = prompt_offsets.size - 1
    if n == 0:
        raise ValueError("batch: no samples")
    if response_offsets.size - 1 != n:
        raise ValueError(f"batch.responses: {response_offsets.size - 1} sequences for {n} prompts")
    logprobs = unpack_floats(msg.rollout_logprobs, "batch.rollout_logprobs", response_flat.size)
    rewards = unpack_floats(msg.rewards, "batch.rewards", n)
    if len(msg.group_ids) != n or len(msg.policy_versions) != n:
        raise ValueError("batch.group_ids / batch.policy_versions need one entry per sample")
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        raise ValueError(f"batch.rewards[{bad[0]}] is not finite ({rewards[bad[0]]})")
    prompts = split_by(prompt_flat, prompt_offsets)
    responses = split_by(response_flat, response_offsets)
    sample_logprobs = split_by(logprobs, response_offsets)
    baselines = _baselines_from_proto(msg, n)
    routed = (
        unpack_routed(msg.routed_experts, n, "batch.routed_experts")
        if msg.HasField("routed_experts")
        else [None] * n
    )
    masks = _loss_masks_from_proto(msg, response_offsets)
    turn_rewards = _turn_rewards_from_proto(msg, response_offsets)
    return [
        TrainSample(
            prompt_ids=prompts[i],
            response_ids=responses[i],
            rollout_logprobs=sample_logprobs[i],
            reward=reward,
            group_id=group_id,
            policy_version=version,
            baseline=baselines[i],
            routed_experts=routed[i],
            loss_mask=masks[i],
            turn_rewards=turn_rewards[i],
        )
        for i, (reward, group_id, version) in enumerate(
            zip(rewards.tolist(), msg.group_ids, msg.policy_versions)
        )
    ]


def result_to_proto(result: TrainStepResult) -> learner_pb2.TrainStepResponse:
    return learner_pb2.TrainStepResponse(
        policy_version=result.policy_version,
        metrics=dict(result.metrics),
        publish_started=result.publish_started,
    )


def result_from_proto(msg: learner_pb2.TrainStepResponse) -> TrainStepResult:
    return TrainStepResult(
        policy_version=msg.policy_version,
        metrics=dict(msg.metrics),
        publish_started=msg.publish_started,
    )


def learner_info_to_proto(info: LearnerInfo) -> learner_pb2.LearnerInfo:
    return learner_pb2.LearnerInfo(
        model=info.model,
        algorithm=info.algorithm,
        policy_version=info.policy_version,
        world_size=info.world_size,
        needs_greedy_baseline=info.needs_greedy_baseline,
        needs_routed_experts=info.needs_routed_experts,
        versions_per_step=info.versions_per_step,
    )


def learner_info_from_proto(msg: learner_pb2.LearnerInfo) -> LearnerInfo:
    return LearnerInfo(
        model=msg.model,
        algorithm=msg.algorithm,
        policy_version=msg.policy_version,
        world_size=msg.world_size,
        needs_greedy_baseline=msg.needs_greedy_baseline,
        needs_routed_experts=msg.needs_routed_experts,
        versions_per_step=msg.versions_per_step,
    )
