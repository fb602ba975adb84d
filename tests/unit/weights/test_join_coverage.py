"""At weight-sync join the learner checks the plan against its own parameters: a family
module that leaves one out fails the join naming it, before any replica is contacted. At TP 1
(whole tensors, each side planning from its own table) a replica that lacks a learner
parameter fails the join naming it too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.models.families import FAMILIES, DecoderLayout, ModelFamily
from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.dist import DistPublisher
from tests.family_checkpoints import build_family_checkpoint


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
                tp_size=lambda target: 2,
            )
    finally:
        publisher.close()
    assert joined == []  # refused before any replica was asked to join


def test_a_tp1_replica_that_lacks_a_learner_parameter_fails_the_join_naming_it(
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    from hybridflow.weights.dist import DistReceiver, param_table

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
