"""The topology a tensor-parallel vLLM replica receives: unfused HF-named slices, the
vocabulary split only where vLLM's padded split equals an even one."""

from __future__ import annotations

from types import SimpleNamespace

from hybridflow.resharding.llama import LlamaDims, llama_dims_from_config, vllm_sliced_topology
from hybridflow.resharding.plan import make_plan
from hybridflow.resharding.topology import Placement
from hybridflow.weights.dist import replicated_topology, weight_sync_topology

DIMS = LlamaDims(
    hidden=64, intermediate=128, num_heads=4, num_kv_heads=2, head_dim=16, vocab=128,
    num_layers=2, tie_embeddings=False, dtype="float32",
)  # fmt: skip


def placements(dims: LlamaDims) -> dict[str, Placement]:
    return {d.name: d.parts[0].placement for d in vllm_sliced_topology(dims).dests}


def test_unfused_hf_names_and_vocab_rule() -> None:
    p = placements(DIMS)
    assert p["model.layers.0.self_attn.q_proj.weight"] is Placement.COLUMN
    assert p["model.layers.0.self_attn.o_proj.weight"] is Placement.ROW
    assert p["model.layers.1.mlp.down_proj.weight"] is Placement.ROW
    assert p["model.embed_tokens.weight"] is Placement.VOCAB  # 128: a multiple of 64
    assert p["lm_head.weight"] is Placement.VOCAB
    odd = placements(LlamaDims(**{**DIMS.__dict__, "vocab": 101}))
    assert odd["model.embed_tokens.weight"] is Placement.REPLICATED  # vLLM pads 101 to 128


def test_each_tp2_rank_receives_half_of_the_sliced_weights() -> None:
    topology = vllm_sliced_topology(DIMS)
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
    dims = llama_dims_from_config(cfg, "float32")
    assert (dims.head_dim, dims.num_kv_heads, dims.tie_embeddings) == (32, 2, True)
