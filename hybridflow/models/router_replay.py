"""Router replay (R3): run a mixture-of-experts forward with the experts the rollout chose.

Rollout engines and the learner compute the router's top-k on slightly different numbers
(other kernels, other precision); where two experts nearly tie, they pick different experts
for the same token, and the learner's log-probs then belong to another computation than the
sampled ones. Replaying the rollout's choice keeps the learner's routing weights (softmax of
its own router logits, so the router still gets gradients) but takes the expert indices from
the rollout. vLLM 0.32 reports them per completion (``enable_return_routed_experts``:
``CompletionOutput.routed_experts``, [tokens, layers, top_k]).

Knows transformers' Qwen3-MoE router (``Qwen3MoeTopKRouter``: returns logits, top-k weights,
top-k indices); nothing of engines, services or the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def moe_routers(model: nn.Module) -> dict[int, nn.Module]:
    """Layer index -> router module of every mixture-of-experts layer of ``model``."""
    layers = model.get_submodule("model.layers")
    routers = {}
    for i, layer in enumerate(layers):  # type: ignore[arg-type, var-annotated]
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and hasattr(gate, "top_k") and hasattr(gate, "norm_topk_prob"):
            routers[i] = gate
    return routers


@contextmanager
def replay_routing(model: nn.Module, routed: torch.Tensor | None) -> Iterator[None]:
    """Within the block, every MoE layer ``i`` routes token ``t`` of a one-sequence forward
    to ``routed[t, i]`` (``routed``: [tokens, layers, top_k] expert ids, as vLLM reports
    them; tokens past its end, such as the last sampled one, keep the router's own choice).
    ``routed`` None: no replay."""
    if routed is None:
        yield
        return
    routers = moe_routers(model)
    saved: list[tuple[nn.Module, Any]] = []
    for i, router in routers.items():
        saved.append((router, router.forward))
        router.forward = _replaying(router, routed[:, i].long())  # type: ignore[method-assign]
    try:
        yield
    finally:
        for router, forward in saved:
            router.forward = forward  # type: ignore[method-assign]


def _replaying(router: Any, chosen: torch.Tensor) -> Any:
    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden_states = hidden_states.reshape(-1, router.hidden_dim)
        logits = F.linear(hidden_states, router.weight)
        probs = F.softmax(logits, dtype=torch.float, dim=-1)
        own = torch.topk(probs, router.top_k, dim=-1).indices
        n = min(len(chosen), len(own))
        indices = torch.cat([chosen[:n].to(own.device), own[n:]])
        weights = probs.gather(-1, indices)
        if router.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), indices

    return forward
