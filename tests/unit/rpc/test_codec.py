import numpy as np
import pytest
import torch

from hybridflow.rpc import codec
from hybridflow.v1 import common_pb2, learner_pb2


def test_tokens_round_trip_including_empty_sequences():
    seqs = [[1, 2, 3], [], [7], [2**31 - 1, 0]]
    msg = codec.pack_tokens(seqs)
    assert list(msg.offsets) == [0, 3, 3, 4, 6]
    assert len(msg.token_ids) == 6 * 4
    assert [s.tolist() for s in codec.unpack_tokens(msg)] == seqs


def test_tokens_reject_bad_offsets_and_overflow():
    msg = codec.pack_tokens([[1, 2]])
    msg.offsets[-1] = 5
    with pytest.raises(ValueError, match="prompts.offsets must start at 0 and end at 2"):
        codec.unpack_tokens(msg, "prompts")
    with pytest.raises(ValueError, match="int32"):
        codec.pack_tokens([[2**31]])
    with pytest.raises(ValueError, match="divisible by 4"):
        codec.unpack_tokens(common_pb2.TokenBatch(token_ids=b"abc", offsets=[0, 1]))


def test_floats_check_dtype_and_size():
    msg = codec.pack_floats([0.5, -1.0])
    assert codec.unpack_floats(msg, "x").tolist() == [0.5, -1.0]
    with pytest.raises(ValueError, match="x: expected 3 values, got 2"):
        codec.unpack_floats(msg, "x", expected_size=3)
    msg.dtype = "float64"
    with pytest.raises(ValueError, match="x: dtype must be float32"):
        codec.unpack_floats(msg, "x")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float16])
def test_tensor_round_trip_is_bit_exact(dtype):
    t = (torch.randn(3, 5) * 100).to(dtype)
    msg = codec.tensor_to_proto(t)
    assert len(msg.data) == t.numel() * t.element_size()  # bf16 travels as its 2 bytes
    back = codec.tensor_from_proto(msg)
    assert back.dtype == dtype and torch.equal(back, t)


def test_tensor_shape_mismatch_names_the_field():
    msg = codec.tensor_to_proto(torch.zeros(4))
    msg.shape[:] = [5]
    with pytest.raises(
        ValueError, match="weights: tensor of float32\\[5\\] needs 20 bytes, got 16"
    ):
        codec.tensor_from_proto(msg, "weights")


def test_chunks_reassemble_and_detect_truncation():
    payload = bytes(np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8))
    chunks = list(codec.iter_chunks(payload, 4096))
    assert [len(c.data) for c in chunks] == [4096, 4096, 1808]
    assert codec.assemble_chunks(chunks, max_bytes=1 << 20) == payload
    with pytest.raises(ValueError, match="ended after 8192 of 10000"):
        codec.assemble_chunks(chunks[:2], max_bytes=1 << 20)
    with pytest.raises(ValueError, match="exceeds server.max_message_bytes"):
        codec.assemble_chunks(chunks, max_bytes=100)
    with pytest.raises(ValueError, match="out of order"):
        codec.assemble_chunks([chunks[1], chunks[0]], max_bytes=1 << 20)


def test_message_streaming_round_trip():
    batch = learner_pb2.TrainBatch(group_ids=list(range(1000)))
    back = codec.receive_message(
        codec.stream_message(batch, 65536), learner_pb2.TrainBatch, 1 << 20
    )
    assert back == batch
    empty = codec.receive_message(
        codec.stream_message(learner_pb2.TrainBatch(), 65536), learner_pb2.TrainBatch, 1 << 20
    )
    assert empty == learner_pb2.TrainBatch()
