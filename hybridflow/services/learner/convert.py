"""Proto ↔ domain conversions of the learner service."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hybridflow.rpc.codec import (
    pack_float_seqs,
    pack_floats,
    pack_tokens,
    unpack_floats,
    unpack_tokens,
)
from hybridflow.types import TrainSample, TrainStepResult
from hybridflow.v1 import learner_pb2


def batch_to_proto(samples: Sequence[TrainSample]) -> learner_pb2.TrainBatch:
    return learner_pb2.TrainBatch(
        prompts=pack_tokens([s.prompt_ids for s in samples]),
        responses=pack_tokens([s.response_ids for s in samples]),
        rollout_logprobs=pack_float_seqs([s.rollout_logprobs for s in samples]),
        rewards=pack_floats([s.reward for s in samples]),
        group_ids=[s.group_id for s in samples],
        policy_versions=[s.policy_version for s in samples],
    )


def batch_from_proto(msg: learner_pb2.TrainBatch) -> list[TrainSample]:
    prompts = unpack_tokens(msg.prompts, "batch.prompts")
    responses = unpack_tokens(msg.responses, "batch.responses")
    n = len(prompts)
    if n == 0:
        raise ValueError("batch: no samples")
    if len(responses) != n:
        raise ValueError(f"batch.responses: {len(responses)} sequences for {n} prompts")
    num_tokens = sum(len(r) for r in responses)
    logprobs = unpack_floats(msg.rollout_logprobs, "batch.rollout_logprobs", num_tokens)
    rewards = unpack_floats(msg.rewards, "batch.rewards", n)
    if len(msg.group_ids) != n or len(msg.policy_versions) != n:
        raise ValueError("batch.group_ids / batch.policy_versions need one entry per sample")
    samples = []
    start = 0
    for i in range(n):
        if not math.isfinite(rewards[i]):
            raise ValueError(f"batch.rewards[{i}] is not finite ({rewards[i]})")
        length = len(responses[i])
        samples.append(
            TrainSample(
                prompt_ids=prompts[i],
                response_ids=responses[i],
                rollout_logprobs=logprobs[start : start + length],
                reward=rewards[i],
                group_id=int(msg.group_ids[i]),
                policy_version=int(msg.policy_versions[i]),
            )
        )
        start += length
    return samples


def result_to_proto(result: TrainStepResult) -> learner_pb2.TrainStepResponse:
    return learner_pb2.TrainStepResponse(
        policy_version=result.policy_version, metrics=dict(result.metrics)
    )


def result_from_proto(msg: learner_pb2.TrainStepResponse) -> TrainStepResult:
    return TrainStepResult(policy_version=msg.policy_version, metrics=dict(msg.metrics))
