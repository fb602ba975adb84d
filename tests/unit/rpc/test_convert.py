"""Proto ↔ domain conversions round-trip, per service."""

import math
from dataclasses import replace

import pytest

from hybridflow.rpc.codec import pack_floats
from hybridflow.services.learner import convert as learner_convert
from hybridflow.services.reward import convert as reward_convert
from hybridflow.services.rollout import convert as rollout_convert
from hybridflow.types import (
    Completion,
    LearnerInfo,
    RolloutStatus,
    SamplingParams,
    ScoreItem,
    ScoreResult,
    TrainSample,
    TrainStepResult,
)
from hybridflow.v1 import common_pb2


def test_sampling_round_trip_keeps_seed_zero():
    for params in (
        SamplingParams(
            temperature=0.7,
            top_p=0.9,
            top_k=5,
            max_new_tokens=5,
            n=3,
            seed=0,
            stop_token_ids=(7, 9),
        ),
        SamplingParams(seed=None),
    ):
        assert (
            rollout_convert.sampling_from_proto(rollout_convert.sampling_to_proto(params)) == params
        )


def test_sampling_top_k_crosses_the_wire_and_a_negative_one_is_refused():
    msg = rollout_convert.sampling_to_proto(SamplingParams(top_k=40))
    assert msg.top_k == 40
    assert rollout_convert.sampling_from_proto(msg).top_k == 40
    unset = common_pb2.SamplingParams(n=1, max_new_tokens=1, top_p=1)  # an older client's
    assert rollout_convert.sampling_from_proto(unset).top_k == 0  # proto3 default: off
    msg.top_k = -1
    with pytest.raises(ValueError, match="sampling.top_k"):
        rollout_convert.sampling_from_proto(msg)


def test_completions_round_trip_with_and_without_token_versions():
    comps = [
        Completion([1, 2, 3], [-0.5, -0.25, -0.125], "stop", 4),
        Completion([], [], "length", 4),
        Completion([5, 6], [-1.0, -2.0], "length", 3, token_versions=[3, 4]),
    ]
    back = rollout_convert.completions_from_proto(rollout_convert.completions_to_proto(comps))
    assert [c.token_ids.tolist() for c in back] == [c.token_ids.tolist() for c in comps]
    assert [c.logprobs.tolist() for c in back] == [c.logprobs.tolist() for c in comps]
    assert [c.finish_reason for c in back] == ["stop", "length", "length"]
    assert [c.token_versions.tolist() for c in back] == [[4, 4, 4], [], [3, 4]]  # type: ignore[union-attr]
    plain = rollout_convert.completions_from_proto(rollout_convert.completions_to_proto(comps[:2]))
    assert all(c.token_versions is None for c in plain)


def test_generate_request_round_trip_and_validation():
    msg = rollout_convert.generate_request([[1, 2], [3]], SamplingParams(n=2), "r1")
    prompts, params = rollout_convert.parse_generate_request(msg)
    assert [p.tolist() for p in prompts] == [[1, 2], [3]] and params.n == 2
    msg.sampling.n = 0
    with pytest.raises(ValueError, match="sampling.n"):
        rollout_convert.parse_generate_request(msg)


def test_status_round_trip():
    status = RolloutStatus("m", "hf", 3, 2, 101, 7, 70, engine_steps=12, num_active_requests=1)
    assert rollout_convert.status_from_proto(rollout_convert.status_to_proto(status)) == status


def test_learner_info_round_trip():
    info = LearnerInfo("builtin:tiny", "ppo", 7, 2, True, False, 4)
    assert (
        learner_convert.learner_info_from_proto(learner_convert.learner_info_to_proto(info)) == info
    )


def test_score_items_and_results_round_trip():
    items = [ScoreItem("arith", "7", "7", "3+4=", {"k": [1, 2]}), ScoreItem("x", "", None)]
    assert reward_convert.items_from_proto(reward_convert.items_to_proto(items)) == items
    results = [ScoreResult(1.0), ScoreResult(0.0, "item 1: boom")]
    msg = reward_convert.results_to_proto(results)
    assert msg.num_errors == 1
    assert reward_convert.results_from_proto(msg) == results


def test_score_result_components_round_trip():
    results = [
        ScoreResult(0.75, components={"rule": 1.0, "rm": -0.5}),
        ScoreResult(0.0, "item 1: no reward component applies"),
    ]
    msg = reward_convert.results_to_proto(results)
    assert dict(msg.results[0].components) == {"rule": 1.0, "rm": -0.5}
    assert not msg.results[1].components
    decoded = reward_convert.results_from_proto(
        type(msg).FromString(msg.SerializeToString())  # through the bytes, as on the wire
    )
    assert decoded == results


def test_train_batch_and_result_round_trip():
    samples = [
        TrainSample([1, 2], [3, 4, 5], [-0.5, -1.0, -2.0], 1.0, 7, 2),
        TrainSample([9], [8], [-0.25], 0.0, 7, 1),
    ]
    assert learner_convert.batch_from_proto(learner_convert.batch_to_proto(samples)) == samples
    result = TrainStepResult(3, {"actor/pg_loss": 0.5})
    assert learner_convert.result_from_proto(learner_convert.result_to_proto(result)) == result


def test_train_batch_baselines_round_trip_none_included():
    samples = [
        TrainSample([1, 2], [3, 4, 5], [-0.5, -1.0, -2.0], 1.0, 7, 2, baseline=0.25),
        TrainSample([9], [8], [-0.25], 0.0, 7, 1, baseline=None),
        TrainSample([9], [6], [-0.75], 0.5, 8, 1, baseline=-1.5),
    ]
    msg = learner_convert.batch_to_proto(samples)
    assert msg.HasField("baselines")
    back = learner_convert.batch_from_proto(msg)
    assert back == samples
    assert [s.baseline for s in back] == [0.25, None, -1.5]
    plain = [replace(s, baseline=None) for s in samples]
    msg = learner_convert.batch_to_proto(plain)
    assert not msg.HasField("baselines")  # no baseline: nothing extra on the wire
    assert [s.baseline for s in learner_convert.batch_from_proto(msg)] == [None] * 3


def test_train_batch_baselines_must_be_finite():
    sample = TrainSample([1], [2], [-1.0], 1.0, 0, 0, baseline=math.nan)
    with pytest.raises(ValueError, match=r"samples\[0\]\.baseline is not finite"):
        learner_convert.batch_pieces([sample])
    msg = learner_convert.batch_to_proto([replace(sample, baseline=1.0)])
    msg.baselines.CopyFrom(pack_floats([math.inf]))
    with pytest.raises(ValueError, match=r"batch\.baselines\[0\] is not finite"):
        learner_convert.batch_from_proto(msg)
    msg.baselines.CopyFrom(pack_floats([1.0, 2.0]))
    with pytest.raises(ValueError, match="batch.baselines"):
        learner_convert.batch_from_proto(msg)
