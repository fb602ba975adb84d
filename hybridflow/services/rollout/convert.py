"""Proto ↔ domain conversions of the rollout service (the only non-servicer proto user)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hybridflow.arrays import TokenArray
from hybridflow.rpc import wire
from hybridflow.rpc.codec import (
    pack_ints,
    pack_tokens,
    sampling_from_proto,
    sampling_to_proto,
    split_by,
    token_buffer,
    unpack_floats,
    unpack_ints,
)
from hybridflow.rpc.routing import pack_routed, unpack_routed
from hybridflow.types import Completion, RolloutStatus, SamplingParams
from hybridflow.v1 import common_pb2, rollout_pb2

_FINISH_TO_PROTO = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
}
_FINISH_FROM_PROTO = {v: k for k, v in _FINISH_TO_PROTO.items()}


def completion_pieces(completions: Sequence[Completion]) -> list[wire.Piece]:
    """A serialized ``Completions`` as pieces (see rpc/wire.py): one concatenation per array
    field, the rest through the generated class."""
    rest = common_pb2.Completions(
        finish_reasons=[_FINISH_TO_PROTO[c.finish_reason] for c in completions],
        policy_versions=[c.policy_version for c in completions],
    )
    if any(c.token_versions is not None for c in completions):
        versions = [
            c.token_versions
            if c.token_versions is not None
            else np.full(c.token_ids.size, c.policy_version, dtype=np.int32)
            for c in completions
        ]
        rest.token_versions.CopyFrom(pack_ints(np.concatenate(versions)))
    if any(c.routed_experts is not None for c in completions):
        rest.routed_experts.CopyFrom(pack_routed([c.routed_experts for c in completions]))
    fields = common_pb2.Completions
    return [
        *wire.bytes_field(
            fields.TOKENS_FIELD_NUMBER, wire.token_batch([c.token_ids for c in completions])
        ),
        *wire.bytes_field(
            fields.LOGPROBS_FIELD_NUMBER, wire.float_tensor([c.logprobs for c in completions])
        ),
        wire.message_piece(rest),
    ]


def completions_to_proto(completions: Sequence[Completion]) -> common_pb2.Completions:
    return common_pb2.Completions.FromString(b"".join(completion_pieces(completions)))


def generate_response(
    request_id: str, first_prompt_index: int, groups: Sequence[Sequence[Completion]]
) -> rollout_pb2.GenerateResponse:
    """One message of the Generate stream, its completions parsed in place (one copy)."""
    reply = rollout_pb2.GenerateResponse(
        request_id=request_id, first_prompt_index=first_prompt_index, num_prompts=len(groups)
    )
    reply.completions.MergeFromString(b"".join(completion_pieces([c for g in groups for c in g])))
    return reply


def completions_from_proto(msg: common_pb2.Completions) -> list[Completion]:
    """Completions whose arrays are views over the message's bytes."""
    flat, offsets = token_buffer(msg.tokens, "completions.tokens")
    count = offsets.size - 1
    logprobs = unpack_floats(msg.logprobs, "completions.logprobs", expected_size=flat.size)
    if len(msg.finish_reasons) != count or len(msg.policy_versions) != count:
        raise ValueError(
            "completions: finish_reasons / policy_versions must have one per completion"
        )
    token_versions = (
        split_by(unpack_ints(msg.token_versions, "completions.token_versions", flat.size), offsets)
        if msg.HasField("token_versions")
        else [None] * count
    )
    routed = (
        unpack_routed(msg.routed_experts, count, "completions.routed_experts")
        if msg.HasField("routed_experts")
        else [None] * count
    )
    reasons = []
    for reason in msg.finish_reasons:
        if reason not in _FINISH_FROM_PROTO:
            raise ValueError(f"completions.finish_reasons: unknown value {reason}")
        reasons.append(_FINISH_FROM_PROTO[reason])
    return [
        Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=reason,  # type: ignore[arg-type]
            policy_version=version,
            token_versions=versions,
            routed_experts=experts,
        )
        for ids, lps, reason, version, versions, experts in zip(
            split_by(flat, offsets),
            split_by(logprobs, offsets),
            reasons,
            msg.policy_versions,
            token_versions,
            routed,
        )
    ]


def generate_request(
    prompts: Sequence[Any], params: SamplingParams, request_id: str
) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(
        request_id=request_id, prompts=pack_tokens(prompts), sampling=sampling_to_proto(params)
    )


def parse_generate_request(
    msg: rollout_pb2.GenerateRequest,
) -> tuple[list[TokenArray], SamplingParams]:
    flat, offsets = token_buffer(msg.prompts, "prompts")
    if offsets.size < 2:
        raise ValueError("prompts: at least one prompt is required")
    if bool(np.any(offsets[1:] == offsets[:-1])):
        raise ValueError("prompts: every prompt needs at least one token")
    prompts = split_by(flat, offsets)
    if not msg.HasField("sampling"):
        raise ValueError("sampling: required")
    return prompts, sampling_from_proto(msg.sampling)


def status_to_proto(status: RolloutStatus) -> rollout_pb2.RolloutInfo:
    return rollout_pb2.RolloutInfo(
        model=status.model,
        engine=status.engine,
        policy_version=status.policy_version,
        eos_token_id=status.eos_token_id,
        vocab_size=status.vocab_size,
        num_requests=status.num_requests,
        num_generated_tokens=status.num_generated_tokens,
        tensor_parallel_size=status.tensor_parallel_size,
        engine_steps=status.engine_steps,
        num_active_requests=status.num_active_requests,
    )


def status_from_proto(msg: rollout_pb2.RolloutInfo) -> RolloutStatus:
    return RolloutStatus(
        model=msg.model,
        engine=msg.engine,
        policy_version=msg.policy_version,
        eos_token_id=msg.eos_token_id,
        vocab_size=msg.vocab_size,
        num_requests=msg.num_requests,
        num_generated_tokens=msg.num_generated_tokens,
        tensor_parallel_size=msg.tensor_parallel_size or 1,
        engine_steps=msg.engine_steps,
        num_active_requests=msg.num_active_requests,
    )
