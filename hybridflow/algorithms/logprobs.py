"""Per-token log-probabilities of chosen tokens under temperature-scaled logits.

The numerics contract shared with the rollout engine: ``log_softmax(logits / T)[token]``, with
temperature 0 (greedy sampling) reported at T = 1. Nothing here knows about padding or models.
"""

from __future__ import annotations

import torch


def effective_temperature(temperature: float) -> float:
    """The temperature log-probs are taken at: 0 (greedy) counts as 1."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return 1.0 if temperature == 0 else float(temperature)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log_softmax(logits / T)`` gathered at ``labels``; ``logits [..., V]``, ``labels [...]``."""
    scaled = logits / effective_temperature(temperature)
    logp = torch.log_softmax(scaled.float(), dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
