"""The family registry's conformance suite: every family's topology names exactly the
parameters transformers' own model of that family holds (tied and untied), each TP 2 rank
receives half of what is split, the vocabulary rule, what vLLM's workers hold, and an unknown
family refused by name. Plus the coverage check that turns a left-out parameter into an error."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from hybridflow.models.families import (
    FAMILIES,
    DecoderDims,
    DecoderLayout,
    ModelFamily,
    family_for,
    supported_model_types,
)
from hybridflow.resharding.coverage import check_learner_covered, check_same_params
from hybridflow.resharding.plan import make_plan
from hybridflow.resharding.topology import Placement
from hybridflow.weights.dist_formation import (
    param_table,
    replicated_topology,
    weight_sync_topology,
)
from tests.family_checkpoints import FAMILY_CONFIGS

UNTIED_REFUSED = {"gemma2"}
"""Families whose vLLM model has no head of its own: an untied config is refused."""
DIMS = DecoderDims(
    hidden=64, intermediate=128, num_heads=4, num_kv_heads=2, head_dim=16, vocab=128,
    num_layers=2, tie_embeddings=False, dtype="float32",
)  # fmt: skip


def test_the_registry_serves_every_family_the_fixtures_build() -> None:
    assert set(FAMILY_CONFIGS) == set(FAMILIES) == set(supported_model_types())


def test_an_unknown_family_is_refused_by_name_with_the_supported_list() -> None:
    with pytest.raises(
        ValueError,
        match="'qwen3_next'.*supported: gemma2, gemma3_text, llama, mistral, qwen2, qwen3, qwen3_moe$",
    ):
        family_for("qwen3_next")


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_topology_names_exactly_what_transformers_model_holds(
    model_type: str, tied: bool, tmp_path: Path
) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.family_checkpoints import build_family_checkpoint

    path = build_family_checkpoint(tmp_path, model_type, tied)
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    family = family_for(config.model_type)
    if not tied and model_type in UNTIED_REFUSED:
        with pytest.raises(ValueError, match="tie_word_embeddings=false"):
            family.dims(config, "float32")
        return
    dims = family.dims(config, "float32")
    assert (dims.head_dim, dims.num_kv_heads, dims.tie_embeddings) == (32, 2, tied)
    table = param_table(model)
    for topology in (family.topology(dims), family.sliced_topology(dims)):
        check_learner_covered(topology, table)


def placements(family: ModelFamily, dims: DecoderDims) -> dict[str, Placement]:
    return {d.name: d.parts[0].placement for d in family.sliced_topology(dims).dests}


def test_unfused_hf_names_and_vocab_rule() -> None:
    p = placements(FAMILIES["qwen3"], DIMS)
    assert p["model.layers.0.self_attn.q_proj.weight"] is Placement.COLUMN
    assert p["model.layers.0.self_attn.o_proj.weight"] is Placement.ROW
    assert p["model.layers.0.self_attn.q_norm.weight"] is Placement.REPLICATED
    assert p["model.layers.1.mlp.down_proj.weight"] is Placement.ROW
    assert p["model.embed_tokens.weight"] is Placement.VOCAB  # 128: a multiple of 64
    assert p["lm_head.weight"] is Placement.VOCAB
    odd = placements(FAMILIES["llama"], replace(DIMS, vocab=101))
    assert odd["model.embed_tokens.weight"] is Placement.REPLICATED  # vLLM pads 101 to 128
    qwen2 = placements(FAMILIES["qwen2"], DIMS)
    assert qwen2["model.layers.0.self_attn.k_proj.bias"] is Placement.COLUMN


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_tp2_rank_receives_half_of_the_sliced_weights(model_type: str) -> None:
    topology = FAMILIES[model_type].sliced_topology(DIMS)
    plan = make_plan(topology, 2, [2], 1 << 20)
    norms = sum(p.num_bytes for p in topology.params if p.name.endswith("norm.weight"))
    for rank in (0, 1):
        # Everything but the (replicated) norms is split in two.
        assert plan.bytes_received(0, rank) == (topology.num_bytes - norms) // 2 + norms


def test_tp1_replicas_keep_whole_tensors_for_any_model() -> None:
    table = [("a.weight", (4, 3), "float32"), ("b.bias", (3,), "float32")]
    assert weight_sync_topology(table, [1, 1], None) == replicated_topology(table)


def test_dims_from_a_hf_config() -> None:
    cfg = SimpleNamespace(
        hidden_size=64, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=101, num_hidden_layers=2, tie_word_embeddings=True,
    )  # fmt: skip
    dims = FAMILIES["llama"].dims(cfg, "float32")
    assert (dims.head_dim, dims.num_kv_heads, dims.tie_embeddings) == (32, 2, True)


def test_engine_shapes_are_what_a_tp2_vllm_worker_holds() -> None:
    """As read from vLLM 0.32's Qwen3 worker at TP 2 (the fixtures' sizes, tied)."""
    dims = DecoderDims(128, 256, 4, 2, 32, 128, 2, True, "float32")
    shapes = FAMILIES["qwen3"].engine_param_shapes(dims, 2)
    attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (64, 128)
    assert shapes[attn + "qkv_proj.weight"] == (128, 128)  # 64 q rows + 32 k + 32 v
    assert shapes[attn + "o_proj.weight"] == (128, 64)
    assert shapes[attn + "q_norm.weight"] == (32,)
    assert shapes[mlp + "gate_up_proj.weight"] == (256, 128)
    assert shapes[mlp + "down_proj.weight"] == (128, 128)
    assert len(shapes) == 3 + 2 * 8  # embed, norm, head (tied); 8 per layer
    odd = FAMILIES["llama"].engine_param_shapes(replace(dims, vocab=101), 2)
    assert odd["model.embed_tokens.weight"] == (64, 128)  # padded to 128, then split


def test_a_family_that_leaves_out_a_parameter_is_an_error_naming_it() -> None:
    qwen2 = FAMILIES["qwen2"]
    no_bias = ModelFamily("qwen2", DecoderLayout())
    table = [(p.name, p.shape, p.dtype) for p in qwen2.topology(DIMS).params]
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.k_proj\.bias'"):
        check_learner_covered(no_bias.sliced_topology(DIMS), table)
    held = qwen2.engine_param_shapes(DIMS, 2)
    with pytest.raises(ValueError, match=r"qkv_proj\.bias.*keep its old values"):
        check_same_params(no_bias.engine_param_shapes(DIMS, 2), held, "vLLM", "keep its old values")


MOE_DIMS = replace(
    DIMS, hidden=128, head_dim=32, num_experts=4, moe_intermediate=64, moe_layers=(1,)
)
"""The MoE fixture's sizes with layer 0 dense (``mlp_only_layers: [0]``)."""


@pytest.mark.parametrize(
    "overrides",
    [{"mlp_only_layers": [0]}, {"decoder_sparse_step": 2}, {"num_hidden_layers": 3}],
    ids=["mlp_only_layers", "decoder_sparse_step", "all-routed"],
)
def test_moe_topology_names_what_transformers_holds_dense_and_routed_layers(
    overrides: dict[str, object], tmp_path: Path
) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.family_checkpoints import build_family_checkpoint

    path = build_family_checkpoint(tmp_path, "qwen3_moe", False, **overrides)
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    dims = family_for("qwen3_moe").dims(config, "float32")
    routed = {i for i in range(dims.num_layers) if f"model.layers.{i}.mlp.gate.weight" in
              dict(model.named_parameters())}  # fmt: skip
    assert set(dims.moe_layers) == routed and routed
    table = param_table(model)
    for topology in (FAMILIES["qwen3_moe"].topology(dims), FAMILIES["qwen3_moe"].sliced_topology(dims)):  # fmt: skip
        check_learner_covered(topology, table)


def test_moe_engine_shapes_are_what_a_tp2_vllm_worker_holds() -> None:
    """As read from vLLM 0.32's Qwen3-MoE worker at TP 2 (4 experts of 64, layer 0 dense)."""
    shapes = FAMILIES["qwen3_moe"].engine_param_shapes(MOE_DIMS, 2)
    mlp0, mlp1 = "model.layers.0.mlp.", "model.layers.1.mlp."
    assert shapes[mlp0 + "gate_up_proj.weight"] == (128, 128)
    assert shapes[mlp1 + "experts.routed_experts.w13_weight"] == (4, 64, 128)
    assert shapes[mlp1 + "experts.routed_experts.w2_weight"] == (4, 128, 32)
    assert shapes[mlp1 + "gate.weight"] == (4, 128)
    assert not any(n.startswith(mlp1 + "gate_up") or n.startswith(mlp1 + "down") for n in shapes)


def test_each_tp2_rank_receives_half_of_every_expert_and_the_whole_router() -> None:
    topology = FAMILIES["qwen3_moe"].sliced_topology(MOE_DIMS)
    plan = make_plan(topology, 3, [2], 1 << 12)
    whole = sum(
        p.num_bytes for p in topology.params if p.name.endswith(("norm.weight", "gate.weight"))
    )
    for rank in (0, 1):
        assert plan.bytes_received(0, rank) == (topology.num_bytes - whole) // 2 + whole


def test_moe_tp2_slices_are_vllms_w13_and_w2() -> None:
    """Rank t's slice of the fused gate_up tensor is [gate_t, up_t] along dim 1 (vLLM's
    w13), of down_proj its dim-2 slice (w2): replayed through the plan from 3 FSDP ranks."""
    import torch

    from hybridflow.weights.transport.reference import fsdp_shards
    from hybridflow.weights.transport.replay import replay_in_process

    topology = FAMILIES["qwen3_moe"].sliced_topology(MOE_DIMS)
    full = {p.name: torch.randn(p.shape) for p in topology.params}
    plan = make_plan(topology, 3, [2], 1 << 12)
    outs = replay_in_process(plan, [fsdp_shards(topology, full, 3, s) for s in range(3)])
    gate_up, down = (
        "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.1.mlp.experts.down_proj",
    )
    gate, up = full[gate_up].chunk(2, dim=1)
    for t in (0, 1):
        rows = slice(32 * t, 32 * (t + 1))
        want = torch.cat([gate[:, rows], up[:, rows]], dim=1)
        assert torch.equal(outs[0][t][gate_up], want)
        assert torch.equal(outs[0][t][down], full[down][:, :, rows])


def test_a_moe_family_that_leaves_out_an_expert_tensor_is_an_error_naming_it() -> None:
    topology = FAMILIES["qwen3_moe"].sliced_topology(MOE_DIMS)
    table = [(p.name, p.shape, p.dtype) for p in topology.params]
    table.append(("model.layers.1.mlp.experts.extra_proj", (4, 8, 8), "float32"))
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.experts\.extra_proj'"):
        check_learner_covered(topology, table)


def test_a_vllm_worker_holding_experts_the_family_omits_is_an_error_naming_them() -> None:
    """What ``hf_check_engine_params`` does in every worker: a family that describes no
    experts (dense dims) against a worker that holds FusedMoE's w13/w2 and the router."""
    held = FAMILIES["qwen3_moe"].engine_param_shapes(MOE_DIMS, 2)
    dense = replace(MOE_DIMS, num_experts=0, moe_intermediate=0, moe_layers=())
    with pytest.raises(ValueError, match=r"routed_experts\.w13_weight.*keep its old values"):
        check_same_params(
            FAMILIES["qwen3"].engine_param_shapes(dense, 2), held, "vLLM", "keep its old values"
        )
