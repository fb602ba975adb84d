"""At weight-sync join the learner checks the plan against its own parameters: a family
module that leaves one out fails the join naming it, before any replica is contacted. At TP 1
(whole tensors, each side planning from its own table) a replica that lacks a learner
parameter fails the join naming it too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.models.families import FAMILIES, DecoderLayout, ModelFamily
from hybridflow.resharding.layout import layout_of
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.dist_formation import param_table, replicated_topology
from hybridflow.weights.dist_publisher import DistPublisher
from hybridflow.weights.spec import ReplicaDescription
from tests.family_checkpoints import build_family_checkpoint


def describe_as(family: ModelFamily, model: torch.nn.Module, tp: int) -> ReplicaDescription:
    """What a vLLM replica of ``model`` laid out by ``family`` reports (``hf_weight_layout``)."""
    dims = family.dims(model.config, "float32")
    return ReplicaDescription(tp, layout_of(family.model_type, family.sliced_topology(dims)))


def test_a_family_that_leaves_out_the_qkv_biases_fails_at_join_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_family_checkpoint(tmp_path, "qwen2", True))
    monkeypatch.setitem(FAMILIES, "qwen2", ModelFamily("qwen2", DecoderLayout()))
    joined: list[str] = []
    publisher = DistPublisher(
        WeightSyncConfig(transport="dist", timeout_s=5), 0, 1, model, torch.device("cpu")
    )
    try:
        with pytest.raises(RuntimeError, match=r"'model\.layers\.0\.self_attn\.k_proj\.bias'"):
            publisher.publish_with(
                ["replica"],
                1,
                join=lambda target, spec, index: joined.append(target) or "",
                receive=lambda target, version: 0,
                describe=lambda target: describe_as(FAMILIES["qwen2"], model, 2),
            )
    finally:
        publisher.close()
    assert joined == []  # refused before any replica was asked to join


def test_a_tp1_replica_that_lacks_a_learner_parameter_fails_the_join_naming_it(
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    from hybridflow.weights.dist_formation import param_table
    from hybridflow.weights.dist_receiver import DistReceiver

    model = AutoModelForCausalLM.from_pretrained(build_family_checkpoint(tmp_path, "qwen2", True))
    table = [row for row in param_table(model) if row[0] != "model.layers.1.self_attn.v_proj.bias"]
    receiver = DistReceiver(table, torch.device("cpu"))
    publisher = DistPublisher(
        WeightSyncConfig(transport="dist", timeout_s=10), 0, 1, model, torch.device("cpu")
    )
    try:
        with pytest.raises(
            RuntimeError, match=r"only rank 0's plan has '.*1\.self_attn\.v_proj\.bias'"
        ):
            publisher.publish_with(
                ["replica"],
                1,
                join=lambda target, spec, index: receiver.join(spec, index),
                receive=lambda target, version: 0,
            )
    finally:
        publisher.close()
        receiver.close()


class _Qwen3MoeRowW13(type(FAMILIES["qwen3_moe"])):  # type: ignore[misc]
    """A replica whose experts' gate_up is split like a row (a layout vLLM might change to)."""

    def sliced_topology(self, dims):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        from hybridflow.resharding.topology import DestParam, Placement, Topology

        topology = super().sliced_topology(dims)
        dests = tuple(
            DestParam(d.name, tuple(replace(p, placement=Placement.EXPERT_ROW) for p in d.parts))
            if d.name.endswith("experts.gate_up_proj") else d
            for d in topology.dests
        )  # fmt: skip
        return Topology(topology.params, dests)


@pytest.mark.parametrize(
    "replica",
    ["other-placement", "other-family", "whole-tensors"],
)
def test_a_replica_reporting_another_layout_is_refused_at_join_naming_it(
    tmp_path: Path, replica: str
) -> None:
    """The handshake carries the replica's layout: one that differs from what the learner's
    registry entry gives (an expert tensor split otherwise, another family, no family) is
    refused before any replica is asked to join, naming the parameter or both families."""
    from transformers import AutoModelForCausalLM

    path = build_family_checkpoint(tmp_path, "qwen3_moe", False)
    model = AutoModelForCausalLM.from_pretrained(path)
    reported = {
        "other-placement": describe_as(_Qwen3MoeRowW13("qwen3_moe", FAMILIES["qwen3_moe"].layout),
                                       model, 2),
        "other-family": describe_as(FAMILIES["qwen3"], AutoModelForCausalLM.from_pretrained(
            build_family_checkpoint(tmp_path / "dense", "qwen3", False)), 2),
        "whole-tensors": ReplicaDescription(1, layout_of("", replicated_topology(param_table(
            AutoModelForCausalLM.from_pretrained(build_family_checkpoint(
                tmp_path / "dense", "qwen3", False)))))),
    }[replica]  # fmt: skip
    expected = {
        "other-placement": r"replica r0 places 'model\.layers\.0\.mlp\.experts\.gate_up_proj' "
        r"as \(4, 128, 128\) expert_row \(dim 2 in 2 blocks\).*qwen3_moe layout says "
        r"\(4, 128, 128\) expert_column \(dim 1 in 2 blocks\)",
        "other-family": r"replica r0 holds family 'qwen3' .*the learner's model is 'qwen3_moe'",
        "whole-tensors": r"replica r0 places 'model\.layers\.0\.mlp\.down_proj\.weight'",
    }[replica]
    joined: list[str] = []
    publisher = DistPublisher(
        WeightSyncConfig(transport="dist", timeout_s=5), 0, 1, model, torch.device("cpu")
    )
    try:
        with pytest.raises(RuntimeError, match=expected):
            publisher.publish_with(
                ["r0"],
                1,
                join=lambda target, spec, index: joined.append(target) or "",
                receive=lambda target, version: 0,
                describe=lambda target: reported,
            )
    finally:
        publisher.close()
    assert joined == []


class _Qwen3MoeWithoutDown(type(FAMILIES["qwen3_moe"])):  # type: ignore[misc]
    """A family module that forgets the experts' down projection."""

    def topology(self, dims, fused=True, vocab_placement=None):  # type: ignore[no-untyped-def]
        from hybridflow.resharding.topology import Placement, Topology

        full = super().topology(dims, fused, vocab_placement or Placement.VOCAB)
        keep = [p for p in full.params if not p.name.endswith("experts.down_proj")]
        names = {p.name for p in keep}
        dests = [d for d in full.dests if all(q.source in names for q in d.parts)]
        return Topology(tuple(keep), tuple(dests))


def test_a_moe_family_that_leaves_out_an_expert_tensor_fails_at_join_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        build_family_checkpoint(tmp_path, "qwen3_moe", False)
    )
    forgetful = _Qwen3MoeWithoutDown("qwen3_moe", FAMILIES["qwen3_moe"].layout)
    monkeypatch.setitem(FAMILIES, "qwen3_moe", forgetful)
    joined: list[str] = []
    publisher = DistPublisher(
        WeightSyncConfig(transport="dist", timeout_s=5), 0, 1, model, torch.device("cpu")
    )
    try:
        with pytest.raises(
            RuntimeError, match=r"'model\.layers\.0\.mlp\.experts\.down_proj'.*never be sent"
        ):
            publisher.publish_with(
                ["replica"],
                1,
                join=lambda target, spec, index: joined.append(target) or "",
                receive=lambda target, version: 0,
                describe=lambda target: describe_as(forgetful, model, 2),
            )
    finally:
        publisher.close()
    assert joined == []
