"""MoE routing on the wire: per completion and per train sample, with gaps, and refused when
the message does not describe the sequences it claims to."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.rpc.routing import pack_routed, unpack_routed
from hybridflow.services.learner import convert as learner_convert
from hybridflow.services.rollout import convert as rollout_convert
from hybridflow.types import Completion, SamplingParams, TrainSample


def _routing(tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 8, size=(tokens, 3, 2)).astype(np.int16)


def test_round_trip_keeps_each_sequence_and_its_gaps() -> None:
    arrays = [_routing(5, 0), None, _routing(1, 1), _routing(7, 2)]
    back = unpack_routed(pack_routed(arrays), 4, "routed")
    assert back[1] is None
    for got, want in zip(back, arrays):
        if want is not None:
            assert got is not None and got.dtype == np.int16
            np.testing.assert_array_equal(got, want)


def test_sequences_must_agree_on_layers_and_top_k() -> None:
    with pytest.raises(ValueError, match=r"routed experts \[1\]"):
        pack_routed([_routing(2, 0), _routing(2, 1)[:, :2]])
    with pytest.raises(ValueError, match="no sequence"):
        pack_routed([None, None])


@pytest.mark.parametrize(
    "spoil, match",
    [
        (lambda m: m.offsets.__setitem__(1, 9), "offsets"),
        (lambda m: m.offsets.pop(), "offsets"),
        (lambda m: setattr(m.experts, "dtype", "int32"), "int16"),
        (lambda m: setattr(m.experts, "data", m.experts.data[:-2]), "bytes"),
        (lambda m: setattr(m.experts, "data", b"\xff\xff" + m.experts.data[2:]), "negative"),
    ],
    ids=["offsets-past-rows", "offsets-count", "dtype", "short-data", "negative-id"],
)
def test_a_malformed_message_is_refused_naming_the_field(spoil, match: str) -> None:  # type: ignore[no-untyped-def]
    msg = pack_routed([_routing(3, 0), _routing(2, 1)])
    spoil(msg)
    with pytest.raises(ValueError, match=match) as err:
        unpack_routed(msg, 2, "completions.routed_experts")
    assert "completions.routed_experts" in str(err.value)


def test_completions_and_sampling_carry_routing_through_the_rollout_wire() -> None:
    params = SamplingParams(n=2, return_routed_experts=True)
    assert rollout_convert.sampling_from_proto(rollout_convert.sampling_to_proto(params)) == params
    completions = [
        Completion([4, 5, 6], [-0.1, -0.2, -0.3], "stop", 3, routed_experts=_routing(6, 0)),
        Completion([7], [-0.5], "length", 3, routed_experts=_routing(4, 1)),
    ]
    msg = rollout_convert.completions_to_proto(completions)
    assert rollout_convert.completions_from_proto(msg) == completions
    plain = [Completion([4], [-0.1], "stop", 0)]
    msg = rollout_convert.completions_to_proto(plain)
    assert not msg.HasField("routed_experts")
    assert rollout_convert.completions_from_proto(msg) == plain


def test_train_batch_carries_routing_to_the_learner() -> None:
    samples = [
        TrainSample([1, 2], [3, 4], [-0.1, -0.2], 1.0, 0, 2, routed_experts=_routing(3, 0)),
        TrainSample([1, 2], [5], [-0.3], 0.0, 0, 2, routed_experts=None),
    ]
    back = learner_convert.batch_from_proto(learner_convert.batch_to_proto(samples))
    assert back == samples
