"""Our decoding of the SDK's protobuf wire against the SDK's own encoder and decoder: a
``forward_backward`` request the SDK builds decodes into the datums it holds, and the output
we encode is what the SDK's decoder reads back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tinker import types
from tinker.proto import request_conv, response_conv

from hybridflow.errors import BadRequest
from hybridflow.services.tinker.convert import decode_forward_backward, encode_forward_backward


def _sdk_request(data: list[types.Datum], **config: float | str) -> bytes:
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn="ppo", loss_fn_config=config or None
        ),
        model_id="s:train:0",
        seq_id=7,
    )
    return request_conv.forward_backward_request_to_proto(request).SerializeToString()


def test_a_request_the_sdk_encodes_decodes_into_its_datums() -> None:
    dense = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
        loss_fn_inputs={
            "target_tokens": [6, 7, 8, 9],
            "logprobs": [-1.0, -2.0, -0.5, -0.25],
            "advantages": [1.5, 1.5, 1.5, 1.5],
        },
    )
    two_chunks = types.Datum(
        model_input=types.ModelInput(
            chunks=[
                types.EncodedTextChunk(tokens=[1, 2]),
                types.EncodedTextChunk(tokens=[3]),
            ]
        ),
        loss_fn_inputs={"target_tokens": np.array([2, 3, 4]), "weights": [0.0, 1.0, 1.0]},
    )
    call = decode_forward_backward(
        _sdk_request([dense, two_chunks], clip_low_threshold=0.7, clip_high_threshold=1.3)
    )
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == (
        "s:train:0",
        7,
        "ppo",
        False,
    )
    assert call.config == {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    first, second = call.datums
    assert first.tokens.tolist() == [5, 6, 7, 8]
    assert first.inputs["target_tokens"].tolist() == [6, 7, 8, 9]
    assert first.inputs["target_tokens"].dtype == np.int64
    np.testing.assert_array_equal(first.inputs["logprobs"], [-1.0, -2.0, -0.5, -0.25])
    assert second.tokens.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(second.inputs["weights"], [0.0, 1.0, 1.0])


def test_a_sparse_2d_input_decodes_to_its_dense_values() -> None:
    weights = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]])
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"weights": types.TensorData.from_torch_sparse(weights)},
    )
    (decoded,) = decode_forward_backward(_sdk_request([datum])).datums
    np.testing.assert_array_equal(decoded.inputs["weights"], weights.numpy())


def test_text_config_values_and_garbage_are_refused_by_name() -> None:
    datum = types.Datum(model_input=types.ModelInput.from_ints([1]), loss_fn_inputs={})
    with pytest.raises(BadRequest, match="loss_fn_config\\['mode'\\]"):
        decode_forward_backward(_sdk_request([datum], mode="fancy"))
    with pytest.raises(BadRequest, match="not a ForwardBackwardRequest"):
        decode_forward_backward(b"\xff\xff\xff")


def test_the_output_we_encode_is_what_the_sdk_decodes() -> None:
    logprobs = [np.array([-0.5, -1.25], np.float32), np.array([-2.0], np.float32)]
    body = encode_forward_backward(logprobs, {"loss:sum": 3.75})
    out = response_conv.deserialize_forward_backward_output(body)
    assert out.metrics == {"loss:sum": 3.75}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-0.5, -1.25], [-2.0]]
