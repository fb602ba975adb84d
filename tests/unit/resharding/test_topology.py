"""Topology: FSDP2 row placement, vLLM-style Llama placements, validation."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

from hybridflow.models.families import DecoderDims
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.topology import (
    DestParam,
    DestPart,
    ParamSpec,
    Placement,
    Topology,
    dest_layout,
    fsdp_dim0_rows,
    validate_replicas,
)
from hybridflow.weights.transport.reference import tp_shards

DIMS = DecoderDims(
    hidden=8, intermediate=12, num_heads=4, num_kv_heads=2, head_dim=2, vocab=20, num_layers=1,
    tie_embeddings=False, dtype="float32",
)  # fmt: skip


def test_fsdp_rows_hand_computed() -> None:
    assert fsdp_dim0_rows(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert fsdp_dim0_rows(6, 4) == [(0, 2), (2, 4), (4, 6), (6, 6)]
    assert fsdp_dim0_rows(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert fsdp_dim0_rows(1, 2) == [(0, 1), (1, 1)]


def test_fsdp_rows_match_torch_fsdp2_chunking() -> None:
    for rows in range(1, 20):
        for ranks in range(1, 9):
            chunks = _chunk_with_empty(torch.arange(rows), ranks, dim=0)
            got = [(a, b) for a, b in fsdp_dim0_rows(rows, ranks)]
            want = [(int(c[0]), int(c[-1]) + 1) if c.numel() else None for c in chunks]
            assert [g if g[1] > g[0] else None for g in got] == want


def _full(topology: Topology) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {p.name: torch.randn(p.shape, generator=gen) for p in topology.params}


def test_llama_fused_qkv_and_gate_up_follow_vllm() -> None:
    topo = decoder_topology(DIMS, fused=True)
    full = _full(topo)
    a, m = "model.layers.0.self_attn.", "model.layers.0.mlp."
    q, k, v = (full[a + f"{n}_proj.weight"] for n in "qkv")
    for t in range(2):
        got = tp_shards(topo, full, 2, t)
        want_qkv = torch.cat([q.chunk(2)[t], k.chunk(2)[t], v.chunk(2)[t]])
        assert torch.equal(got[a + "qkv_proj.weight"], want_qkv)
        gate, up = full[m + "gate_proj.weight"], full[m + "up_proj.weight"]
        assert torch.equal(
            got[m + "gate_up_proj.weight"], torch.cat([gate.chunk(2)[t], up.chunk(2)[t]])
        )
        assert torch.equal(
            got[a + "o_proj.weight"], full[a + "o_proj.weight"][:, 4 * t : 4 * t + 4]
        )
        assert torch.equal(
            got[m + "down_proj.weight"], full[m + "down_proj.weight"][:, 6 * t : 6 * t + 6]
        )
        assert torch.equal(
            got["model.embed_tokens.weight"],
            full["model.embed_tokens.weight"][10 * t : 10 * t + 10],
        )
        assert torch.equal(got["model.norm.weight"], full["model.norm.weight"])
    # TP 4 > 2 KV heads: each KV head (2 rows) sits on two consecutive TP ranks, as in vLLM.
    for t in range(4):
        got = tp_shards(topo, full, 4, t)[a + "qkv_proj.weight"]
        want = torch.cat(
            [
                q[2 * t : 2 * t + 2],
                k[2 * (t // 2) : 2 * (t // 2) + 2],
                v[2 * (t // 2) : 2 * (t // 2) + 2],
            ]
        )
        assert got.shape == (6, 8)
        assert torch.equal(got, want)


def test_llama_names_and_tied_embeddings() -> None:
    fused = decoder_topology(DIMS, fused=True)
    assert [d.name for d in fused.dests][:4] == [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
    ]
    assert len(fused.params) == 1 + 9 + 2
    unfused = decoder_topology(DIMS, fused=False)
    assert {d.name for d in unfused.dests} == {p.name for p in unfused.params}
    tied = decoder_topology(DecoderDims(**{**DIMS.__dict__, "tie_embeddings": True}))
    assert "lm_head.weight" not in {p.name for p in tied.params} | {d.name for d in tied.dests}
    shape, offsets = dest_layout(fused, fused.dests[1], 2)
    assert shape == (4 + 2 + 2, 8) and offsets == [0, 4, 6]


def test_validation_names_the_field() -> None:
    p = ParamSpec("w", (6, 4))
    with pytest.raises(ValueError, match="ParamSpec.dtype"):
        ParamSpec("w", (2,), "float13")
    with pytest.raises(ValueError, match="ParamSpec.shape"):
        ParamSpec("w", (0, 2))
    with pytest.raises(ValueError, match="unknown source"):
        Topology((p,), (DestParam("d", (DestPart("nope", Placement.COLUMN),)),))
    with pytest.raises(ValueError, match="splits b on dim 1"):
        Topology((ParamSpec("b", (4,)),), (DestParam("b", (DestPart("b", Placement.ROW),)),))
    topo = Topology((p,), (DestParam("w", (DestPart("w", Placement.COLUMN),)),))
    with pytest.raises(ValueError, match="replicas: tp size 4 needs dim 0 of w"):
        validate_replicas(topo, [2, 4])
    with pytest.raises(ValueError, match=r"replicas\[1\]"):
        validate_replicas(topo, [2, 0])
    kv = Topology((p,), (DestParam("w", (DestPart("w", Placement.COLUMN, 2),)),))
    with pytest.raises(ValueError, match="not a multiple of max_shards"):
        validate_replicas(kv, [3])
