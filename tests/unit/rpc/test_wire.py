"""Hand-written wire pieces parse as the messages the generated classes would build."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hybridflow.rpc import wire
from hybridflow.rpc.codec import assemble_chunks, pack_float_seqs, pack_tokens
from hybridflow.services.learner import convert as learner_convert
from hybridflow.services.rollout import convert as rollout_convert
from hybridflow.services.rollout.servicer import message_spans
from hybridflow.types import Completion, TrainSample
from hybridflow.v1 import common_pb2, learner_pb2


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1])
def test_varint_matches_protobuf(value: int) -> None:
    # offsets field (2) of a TokenBatch with one value: tag 0x12, length, the varint
    encoded = common_pb2.TokenBatch(offsets=[value]).SerializeToString()
    assert encoded == b"\x12" + wire.varint(len(wire.varint(value))) + wire.varint(value)


def test_token_batch_and_tensor_pieces_parse_like_the_classic_encoding() -> None:
    seqs = [np.array([1, 2, 3], np.int32), np.zeros(0, np.int32), np.array([2**31 - 1], np.int32)]
    parsed = common_pb2.TokenBatch.FromString(b"".join(wire.token_batch(seqs)))
    assert parsed == pack_tokens(seqs)
    floats = [np.array([0.5, -1.0], np.float32), np.array([3.0], np.float32)]
    tensor = common_pb2.Tensor.FromString(b"".join(wire.float_tensor(floats)))
    assert tensor == pack_float_seqs(floats)
    empty = common_pb2.TokenBatch.FromString(b"".join(wire.token_batch([])))
    assert list(empty.offsets) == [0] and empty.token_ids == b""


def _samples() -> list[TrainSample]:
    rng = np.random.default_rng(0)
    return [
        TrainSample(
            rng.integers(0, 100, 3 + i, dtype=np.int32),
            rng.integers(0, 100, 1 + 2 * i, dtype=np.int32),
            -rng.random(1 + 2 * i, dtype=np.float32),
            float(i % 2),
            i // 2,
            7 - i,
        )
        for i in range(5)
    ]


def test_train_batch_pieces_round_trip_through_chunks_of_any_size() -> None:
    samples = _samples()
    pieces = learner_convert.batch_pieces(samples)
    whole = b"".join(pieces)
    for chunk_bytes in (1, 7, 64, len(whole), 10 * len(whole)):
        chunks = list(wire.iter_piece_chunks(pieces, chunk_bytes))
        assert all(len(c.data) <= chunk_bytes for c in chunks)
        payload = assemble_chunks(iter(chunks), max_bytes=len(whole))
        assert bytes(payload) == whole
    back = learner_convert.batch_from_proto(learner_pb2.TrainBatch.FromString(whole), 100)
    assert back == samples
    assert [s.rollout_logprobs.dtype for s in back] == [np.float32] * len(samples)


def test_train_batch_pieces_carry_baselines_none_included() -> None:
    samples = [
        replace(s, baseline=None if i == 2 else 0.25 * i - 0.5) for i, s in enumerate(_samples())
    ]
    pieces = learner_convert.batch_pieces(samples)
    chunks = list(wire.iter_piece_chunks(pieces, 7))
    payload = assemble_chunks(iter(chunks), max_bytes=wire.size(pieces))
    back = learner_convert.batch_from_proto(learner_pb2.TrainBatch.FromString(bytes(payload)), 100)
    assert back == samples
    assert [s.baseline for s in back] == [-0.5, -0.25, None, 0.25, 0.5]


def test_empty_payload_is_one_chunk() -> None:
    (chunk,) = wire.iter_piece_chunks([], 16)
    assert chunk.total_bytes == 0 and chunk.data == b""


def test_completion_pieces_keep_per_token_versions() -> None:
    comps = [
        Completion([1, 2], [-0.5, -0.25], "stop", 3),
        Completion([4], [-1.0], "length", 3, token_versions=[4]),
    ]
    reply = rollout_convert.generate_response("r", 2, [comps])
    assert (reply.request_id, reply.first_prompt_index, reply.num_prompts) == ("r", 2, 1)
    back = rollout_convert.completions_from_proto(reply.completions)
    assert back[0].token_ids.tolist() == [1, 2] and back[1].finish_reason == "length"
    assert [c.token_versions.tolist() for c in back] == [[3, 3], [4]]  # type: ignore[union-attr]


def test_generate_messages_end_at_the_prompt_or_byte_bound() -> None:
    def group(tokens: int) -> list[Completion]:
        return [Completion(np.zeros(tokens, np.int32), np.zeros(tokens, np.float32), "stop", 0)]

    groups = [group(10)] * 5
    assert list(message_spans(groups, 2, 1 << 20)) == [(0, 2), (2, 4), (4, 5)]
    # 80 bytes per group: a message ends once it holds 160
    assert list(message_spans(groups, 64, 160)) == [(0, 2), (2, 4), (4, 5)]
    assert list(message_spans([group(1000)], 64, 16)) == [(0, 1)]
    assert list(message_spans([], 64, 16)) == []
