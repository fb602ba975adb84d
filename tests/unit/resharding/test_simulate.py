"""The sync simulator reads the real plan: ranks placed on nodes learner-first, a replica never
split across nodes when it fits one, every byte of the plan on the link it crosses, the
bottleneck named, and the seconds following the links' speeds."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.models.families import DecoderDims
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.plan import make_plan
from hybridflow.resharding.simulate import LinkModel, node_of_ranks, predict

DIMS = DecoderDims(
    hidden=256, intermediate=512, num_heads=8, num_kv_heads=8, head_dim=32, vocab=1024,
    num_layers=2, dtype="bfloat16",
)  # fmt: skip
TOPOLOGY = decoder_topology(DIMS, fused=True)
MODEL_BYTES = TOPOLOGY.num_bytes
GB = 1e9


def links(gpus_per_node: int = 8, intra: float = 400 * GB, inter: float = 50 * GB) -> LinkModel:
    return LinkModel("test", gpus_per_node, intra, inter, latency_s=1e-5, source="made up")


def test_learners_fill_nodes_first_and_replicas_never_straddle_one() -> None:
    plan = make_plan(TOPOLOGY, 12, (4, 2, 4, 8), 1 << 20)
    nodes = node_of_ranks(plan, 8)
    assert list(nodes[:12]) == [0] * 8 + [1] * 4
    # the first TP-4 replica takes node 1's free half; the TP-2 starts node 2 and the next
    # TP-4 joins it; the TP-8 does not fit the 2 GPUs left there, so it takes node 3
    assert list(nodes[12:16]) == [1] * 4 and list(nodes[16:18]) == [2] * 2
    assert list(nodes[18:22]) == [2] * 4 and list(nodes[22:30]) == [3] * 8


def test_disaggregated_sync_is_bound_by_the_network_cards() -> None:
    plan = make_plan(TOPOLOGY, 8, (8,), 1 << 20)  # learner on node 0, the replica on node 1
    p = predict(plan, links())
    assert p.num_nodes == 2
    assert p.intra_node_bytes == 0
    assert p.inter_node_bytes == bucket_bytes(plan) == pytest.approx(MODEL_BYTES, rel=0.01)
    # each TP rank receives its share of the model through its own card
    assert p.max_gpu_ingress_bytes == pytest.approx(
        max(plan.bytes_received(0, r) for r in range(8)), rel=0.01
    )
    assert "over its network card" in p.bottleneck
    busiest = max(p.max_gpu_ingress_bytes, p.max_gpu_egress_bytes)
    assert p.wire_seconds == pytest.approx(busiest / (50 * GB))
    assert p.seconds == pytest.approx(p.wire_seconds + p.max_buckets_per_gpu * 1e-5)


def test_the_same_plan_inside_one_node_crosses_nvlink_only() -> None:
    plan = make_plan(TOPOLOGY, 8, (8,), 1 << 20)
    one_node = predict(plan, links(gpus_per_node=16))
    assert one_node.num_nodes == 1 and one_node.inter_node_bytes == 0
    assert "NVLink" in one_node.bottleneck
    two_nodes = predict(plan, links())
    assert one_node.wire_seconds == pytest.approx(two_nodes.wire_seconds * 50 / 400)


def test_more_replicas_load_the_learners_cards_not_the_replicas() -> None:
    one = predict(make_plan(TOPOLOGY, 8, (8,), 1 << 20), links())
    four_plan = make_plan(TOPOLOGY, 8, (8,) * 4, 1 << 20)
    four = predict(four_plan, links())
    assert four.inter_node_bytes == bucket_bytes(four_plan)
    assert four.inter_node_bytes == pytest.approx(4 * MODEL_BYTES, rel=0.01)
    # each learner GPU now sends its shard four times; a replica GPU still receives one share
    assert four.max_gpu_egress_bytes == pytest.approx(4 * one.max_gpu_egress_bytes, rel=0.01)
    assert four.max_gpu_ingress_bytes == one.max_gpu_ingress_bytes
    assert "learner rank" in four.bottleneck and "sends" in four.bottleneck
    assert four.wire_seconds > one.wire_seconds


def test_every_planned_byte_is_counted_once() -> None:
    plan = make_plan(TOPOLOGY, 6, (2, 4, 1), 1 << 18)
    p = predict(plan, links(gpus_per_node=4))
    # what crosses a link is each bucket's flat buffer: the slices and their alignment
    assert p.inter_node_bytes + p.intra_node_bytes == bucket_bytes(plan)
    assert bucket_bytes(plan) == pytest.approx(3 * MODEL_BYTES, rel=0.01)
    assert p.intra_node_bytes > 0 and p.inter_node_bytes > 0  # the TP-2 shares node 1


def bucket_bytes(plan) -> int:  # noqa: ANN001
    return int(np.sum(plan.bucket_columns["nbytes"]))
