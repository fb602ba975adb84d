"""Entropy of the categorical distribution given by logits.

The caller divides by the sampling temperature first; this function knows nothing about it.
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy over the last dim: ``logsumexp(z) - sum(softmax(z) * z)``; shape drops that dim."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
