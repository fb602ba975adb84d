"""The gRPC weight stream: bounded as a whole by the replica's own weights, not by one message;
chunks no larger than asked; tensors written as their bytes arrive (never the declared size up
front); floating-point tensors sent in the replica's dtype; a bad stream refused with its
reason, nothing applied."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from hybridflow.resharding.layout import ParamLayout, ReplicaLayout
from hybridflow.rpc.config import ChannelConfig, ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.v1 import common_pb2
from hybridflow.weights import convert
from hybridflow.weights.client import GrpcWeightSyncClient
from hybridflow.weights.convert import iter_weight_chunks, receive_weights, stream_bound

KIB = 1024


def some_tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(300, 70, generator=g)),
        ("empty", torch.zeros(0, 5)),
        ("half", torch.randn(33, 17, generator=g).to(torch.bfloat16)),
        ("scalar", torch.tensor(3.5)),
        ("ids", torch.arange(1000, dtype=torch.int64)),
    ]


def test_round_trip_is_bit_equal_in_bounded_chunks() -> None:
    tensors = some_tensors()
    chunks = list(iter_weight_chunks(tensors, 7, chunk_bytes=4 * KIB))
    assert chunks[0].WhichOneof("payload") == "header"
    assert chunks[-1].WhichOneof("payload") == "trailer"
    assert all(0 < len(c.data) <= 4 * KIB for c in chunks[1:-1])
    version, got, num_bytes = receive_weights(chunks, max_bytes=1 << 20)
    assert version == 7
    assert num_bytes == sum(t.numel() * t.element_size() for _, t in tensors)
    assert [n for n, _ in got] == [n for n, _ in tensors]
    for (_, want), (_, have) in zip(tensors, got, strict=True):
        assert have.dtype == want.dtype and have.shape == want.shape
        assert torch.equal(have.view(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


def test_floats_travel_in_the_dtype_asked_for() -> None:
    tensors = some_tensors()
    chunks = list(iter_weight_chunks(tensors, 1, 64 * KIB, dtype="bfloat16"))
    _, got, num_bytes = receive_weights(chunks, max_bytes=1 << 20)
    have = dict(got)
    assert have["a"].dtype == torch.bfloat16
    assert torch.equal(have["a"], tensors[0][1].to(torch.bfloat16))
    assert have["ids"].dtype == torch.int64  # integers as they are
    assert num_bytes == 300 * 70 * 2 + 33 * 17 * 2 + 2 + 1000 * 8


def test_each_tensor_is_allocated_when_its_bytes_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    allocated: list[str] = []
    allocate = convert._TensorFiller._allocate

    def counting(meta: common_pb2.TensorMeta) -> tuple[torch.Tensor, object]:
        allocated.append(meta.name)
        return allocate(meta)

    monkeypatch.setattr(convert._TensorFiller, "_allocate", staticmethod(counting))
    big = [(f"w{i}", torch.ones(256, 256)) for i in range(4)]  # 256 KiB each
    chunks = list(iter_weight_chunks(big, 1, 64 * KIB))
    seen: list[list[str]] = []

    def watched() -> Iterator[common_pb2.WeightChunk]:
        for chunk in chunks:
            seen.append(list(allocated))  # what was allocated before this chunk
            yield chunk

    receive_weights(watched(), max_bytes=1 << 30)  # the bound allows far more than is sent
    assert seen[1] == []  # the header allocated nothing
    assert seen[2] == ["w0"]  # after the first chunk: its tensor only
    assert seen[5] == ["w0"] and seen[6] == ["w0", "w1"]  # 4 chunks per tensor
    assert allocated == ["w0", "w1", "w2", "w3"]


@pytest.mark.parametrize(
    "mangle, words",
    [
        (lambda c: [*c[:-2], c[-1]], "ended after"),
        (lambda c: [*c[:-1], common_pb2.WeightChunk(data=b"x"), c[-1]], "longer than its header"),
        (lambda c: [c[0], c[0], *c[1:]], "second header"),
        (lambda c: c[1:], "must start with a header"),
        (lambda c: c[:-1], "without its trailer"),
        (lambda c: [*c, c[-1]], "goes on after its trailer"),
        (lambda c: [*c[:-1], _trailer(c[-1], drop=1)], "4 fingerprints for 5 tensors"),
    ],
)
def test_a_bad_stream_is_refused_with_its_reason(mangle, words: str) -> None:  # noqa: ANN001
    chunks = list(iter_weight_chunks(some_tensors(), 1, 4 * KIB))
    with pytest.raises(ValueError, match=words):
        receive_weights(mangle(chunks), max_bytes=1 << 20)


def _trailer(chunk: common_pb2.WeightChunk, drop: int) -> common_pb2.WeightChunk:
    """The trailer of ``chunk`` without its last ``drop`` fingerprints."""
    sums, squares = list(chunk.trailer.sums), list(chunk.trailer.squares)
    trailer = common_pb2.WeightTrailer(sums=sums[:-drop], squares=squares[:-drop])
    return common_pb2.WeightChunk(trailer=trailer)


def test_a_tensor_whose_bytes_changed_on_the_way_is_named_and_nothing_returned() -> None:
    """The trailer's fingerprints are the sender's; a byte that changed between the sender's
    cast and the receiver's tensor (here: in the stream itself) fails the whole update with
    ``DeliveryFailed`` naming the tensor."""
    from hybridflow.errors import DeliveryFailed

    chunks = list(iter_weight_chunks(some_tensors(), 4, 64 * KIB))
    data = bytearray(chunks[1].data)
    data[100] ^= 0x01  # one bit of tensor "a"
    chunks[1] = common_pb2.WeightChunk(data=bytes(data))
    with pytest.raises(DeliveryFailed, match="weights v4: tensor a did not arrive as sent"):
        receive_weights(chunks, max_bytes=1 << 20)


def test_a_stream_over_the_bound_is_refused_before_any_byte() -> None:
    chunks = iter_weight_chunks([("a", torch.zeros(1024))], 1, 4 * KIB)
    with pytest.raises(ValueError, match="4096 bytes exceed this replica's bound of 4095"):
        receive_weights(chunks, max_bytes=4095)


def test_the_bound_is_twice_the_replicas_weights_at_four_bytes_an_element() -> None:
    params = (
        ParamLayout("w", (1000, 300), "replicate", -1, 1, 0, "w"),
        ParamLayout("b", (300,), "replicate", -1, 1, 0, "b"),
    )
    elements = 1000 * 300 + 300
    assert stream_bound(ReplicaLayout("", params, "bfloat16")) == 2 * elements * 4
    assert stream_bound(ReplicaLayout("", params, "float64")) == 2 * elements * 8
    assert stream_bound(ReplicaLayout("", (), "")) == 1 << 20


@pytest.fixture(scope="module")
def tools_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``builtin:tiny-tools``: 1.8 MB of fp32 weights, more than the smallest message limit."""
    from hybridflow.models.builtin import ensure_builtin_model

    return ensure_builtin_model("tiny-tools", root=tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_model_larger_than_one_message_syncs_over_grpc(
    tools_model_path: Path, dtype: str
) -> None:
    """A real replica (the hf engine) whose gRPC messages may hold 1 MiB, the least the config
    allows, receives a model whose stream is larger (fp32), in its own dtype (bf16: half the
    bytes), applied; the whole stream is bounded by the replica's weights (a stream declaring
    more is refused at its header, the replica unchanged)."""
    from hybridflow.services.rollout.engine import HFEngine
    from hybridflow.services.rollout.local import LocalRollout
    from hybridflow.weights.servicer import SERVICE_NAME, WeightSyncServicer

    limit = 1 << 20
    rollout = LocalRollout(HFEngine(tools_model_path, dtype=dtype), str(tools_model_path))
    weights = WeightSyncServicer(rollout)  # the bound: the replica's own weights
    server = start_server(
        ServerConfig(max_message_bytes=limit, allow_unauthenticated=True),
        weights.add_to_server,
        [SERVICE_NAME],
    )
    client = GrpcWeightSyncClient(server.address, ChannelConfig(max_message_bytes=limit))
    try:
        model = rollout.engine.model
        # as a learner sends them: the state dict, a tied head under both its names
        learner = {n: p.detach().float() + 0.25 for n, p in model.state_dict().items()}
        assert model.config.tie_word_embeddings and "lm_head.weight" in learner
        elements = sum(t.numel() for t in learner.values())
        sent = elements * (4 if dtype == "float32" else 2)
        if dtype == "float32":
            assert sent > limit
        report = client.send(list(learner.items()), policy_version=3)
        assert report.num_bytes == sent
        assert rollout.policy_version == 3
        for name, param in model.named_parameters():
            assert torch.equal(param.detach(), learner[name].to(param.dtype)), name
        own = sum(p.numel() for p in model.parameters())  # the tied head counted once
        over = [("model.embed_tokens.weight", torch.zeros(2 * own + 1, dtype=torch.int32))]
        with pytest.raises(grpc.RpcError) as err:  # int32 travels as is: 4 bytes an element
            client.send(over, policy_version=4)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exceed this replica's bound" in (err.value.details() or "")
        assert rollout.policy_version == 3
    finally:
        client.close()
        server.stop(0)
