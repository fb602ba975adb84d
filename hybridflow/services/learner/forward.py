"""Forward passes of the learner over a ``PaddedBatch``: response log-probs, entropies, values.

The log-prob numerics follow the contract shared with the rollout engine:
``log_softmax(logits / T)`` at each response token, with the logits taken at the position
before it. Only the response positions are gathered before the softmax (cheaper for big
vocabularies). This module knows nothing about losses, optimizers or ranks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridflow.algorithms.entropy import entropy_from_logits
from hybridflow.algorithms.logprobs import effective_temperature, logprobs_from_logits
from hybridflow.models.router_replay import replay_routing
from hybridflow.services.learner.batching import PaddedBatch


def policy_forward(
    model: nn.Module, batch: PaddedBatch, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs, entropy)`` of the response tokens, each ``[rows, resp]`` fp32.

    Entropy (of the temperature-scaled distribution) is None unless ``with_entropy``.
    Padded response slots hold meaningless values; callers mask them. A batch carrying
    ``routed_experts`` is run with the model's MoE routers replaying them.
    """
    with replay_routing(model, batch.routed_experts):
        out: Any = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
    logits = out.logits
    index = batch.response_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    scaled = logits.gather(1, index).float() / effective_temperature(temperature)
    logprobs = logprobs_from_logits(scaled, batch.response_ids, 1.0)
    entropy = entropy_from_logits(scaled) if with_entropy else None
    return logprobs, entropy


def value_forward(critic: nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """Critic values ``[rows, resp]``: the value of the state before each response token."""
    values = critic(batch.input_ids, batch.attention_mask, batch.position_ids)
    return values.gather(1, batch.response_index)
