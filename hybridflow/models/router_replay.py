"""Router replay (R3): run a mixture-of-experts forward with the experts the rollout chose.

Rollout engines and the learner compute the router's top-k on slightly different numbers
(other kernels, other precision); where two experts nearly tie, they pick different experts
for the same token, and the learner's log-probs then belong to another computation than the
sampled ones. Replaying the rollout's choice keeps the learner's routing weights (softmax of
its own router logits, so the router still gets gradients) but takes the expert indices from
the rollout. vLLM 0.32 reports them per completion (``enable_return_routed_experts``:
``CompletionOutput.routed_experts``, [tokens, layers, top_k]).

In the learner (``learner.moe_router_replay``) a padded batch's routing is laid out by
``batch_routing``; ``check_routing`` refuses a sample whose routing does not fit the model.

Knows transformers' Qwen3-MoE router (``Qwen3MoeTopKRouter``: returns logits, top-k weights,
top-k indices); nothing of engines, services or the wire.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
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


def check_routing(model: nn.Module, routed: np.ndarray, tokens: int, where: str) -> None:
    """ValueError naming ``where`` unless ``routed`` fits ``model``'s MoE layers and covers at
    least ``tokens - 1`` of a ``tokens``-token sequence (the last token is never read)."""
    routers = moe_routers(model)
    layers = len(routers)
    first: Any = next(iter(routers.values()), None)
    top_k = int(first.top_k) if first is not None else 0
    experts = int(first.num_experts) if first is not None else 0
    if routed.ndim != 3 or tuple(routed.shape[1:]) != (layers, top_k):
        raise ValueError(
            f"{where}: routing has shape {tuple(routed.shape)}, the model routes "
            f"[tokens, {layers} MoE layers, top_k {top_k}]"
        )
    if not tokens - 1 <= len(routed) <= tokens:
        raise ValueError(f"{where}: routing of {len(routed)} tokens for a {tokens}-token sequence")
    if routed.size and int(routed.max()) >= experts:
        raise ValueError(f"{where}: expert id {int(routed.max())} >= the model's {experts}")


def batch_routing(
    routings: Sequence[np.ndarray | None], seq_len: int, device: torch.device
) -> torch.Tensor:
    """``[rows * seq_len, layers, top_k]`` expert ids for a right-padded batch (row-major, the
    order MoE blocks flatten tokens in), ``-1`` where a row has none (padding, the last token,
    filler rows): those keep the router's own choice."""
    shaped = next(r for r in routings if r is not None)
    out = np.full((len(routings), seq_len, *shaped.shape[1:]), -1, dtype=np.int64)
    for row, routed in enumerate(routings):
        if routed is not None:
            out[row, : len(routed)] = routed[:seq_len]
    return torch.from_numpy(out.reshape(-1, *shaped.shape[1:])).to(device)


@contextmanager
def replay_routing(model: nn.Module, routed: torch.Tensor | None) -> Iterator[None]:
    """Within the block, the ``j``-th MoE layer routes flattened token ``t`` of each forward to
    ``routed[t, j]`` (``routed``: [tokens, MoE layers in model order, top_k] expert ids, as
    the rollout reports them for one sequence, or ``batch_routing``'s rows for a padded
    batch; ``-1`` entries and tokens past its end keep the router's own choice; vLLM's own
    capture indexes every decoder layer instead). ``routed`` None: no replay."""
    if routed is None:
        yield
        return
    routers = moe_routers(model)
    saved: list[tuple[nn.Module, Any]] = []
    for j, router in enumerate(routers.values()):
        saved.append((router, router.forward))
        router.forward = _replaying(router, routed[:, j].long())  # type: ignore[method-assign]
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
        if len(chosen) > len(own):
            raise ValueError(
                f"router replay: routing of {len(chosen)} tokens for a forward of {len(own)}"
            )
        replay = chosen.to(own.device)
        if len(replay) < len(own):
            pad = torch.full((len(own) - len(replay), own.shape[1]), -1, dtype=replay.dtype)
            replay = torch.cat([replay, pad.to(own.device)])
        indices = torch.where(replay >= 0, replay, own)
        weights = probs.gather(-1, indices)
        if router.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), indices

    return forward
