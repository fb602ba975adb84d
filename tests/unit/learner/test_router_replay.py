"""Router replay (R3) on transformers' Qwen3-MoE: replaying the model's own routing changes
nothing; replaying other experts routes every token there, with the learner's own softmax
weights over the chosen experts (so the router still learns)."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.models.router_replay import moe_routers, replay_routing
from tests.family_checkpoints import build_family_checkpoint


def _own_routing(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """[tokens, layers, top_k] of the experts the model itself picks."""
    routers = moe_routers(model)
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        r.register_forward_hook(lambda m, i, out, li=li: seen.__setitem__(li, out[2]))
        for li, r in routers.items()
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    num_layers = max(routers) + 1
    routed = torch.zeros(ids.shape[1], num_layers, 2, dtype=torch.long)
    for li, idx in seen.items():
        routed[:, li] = idx
    return routed


def test_replaying_own_routing_is_exact_and_other_routing_is_followed(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = build_family_checkpoint(tmp_path, "qwen3_moe", False, mlp_only_layers=[0])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert sorted(moe_routers(model)) == [1]
    ids = torch.tensor([[5, 9, 30, 31, 60, 17, 4]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    own = _own_routing(model, ids)
    with torch.no_grad(), replay_routing(model, own):
        assert torch.equal(model(input_ids=ids).logits, plain)
    other = own.clone()
    other[:, 1] = (own[:, 1] + 1) % 4  # every token to other experts
    with torch.no_grad(), replay_routing(model, other):
        replayed = model(input_ids=ids).logits
    assert (replayed - plain).abs().max() > 1e-3
    assert torch.equal(_own_routing(model, ids), own)  # the replay ended with the block
    with torch.no_grad(), replay_routing(model, other[:3]):  # shorter: the rest is the model's
        partial = model(input_ids=ids).logits
    torch.testing.assert_close(partial[0, :3], replayed[0, :3])
