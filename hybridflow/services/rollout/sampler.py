"""Next-token sampling for the rollout engine: temperature, top-k, top-p, draw, reported
log-prob.

Pure tensor functions over a ``[batch, vocab]`` logits matrix. The draw is from
``softmax(logits / temperature)`` cut to the ``top_k`` most likely tokens, then to the nucleus
of mass ``top_p`` of that (renormalised) distribution, renormalised: the order of
``transformers``' warpers and of vLLM. The reported log-prob of a token is
``log_softmax(logits / temperature)`` at that token, taken *before* top-k and top-p
truncation, because that is what the learner recomputes from a full forward pass. Temperature
0 means greedy (argmax; top-k and top-p have no say), and its reported log-prob uses
temperature 1.

This module knows nothing about models, caches, tokenizers or requests.
"""

from __future__ import annotations

import torch


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` in float32; temperature 0 (greedy) is reported as 1."""
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    scaled = logits.float()
    if temperature > 0.0 and temperature != 1.0:
        scaled = scaled / temperature
    return scaled


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set to -inf every logit outside the ``top_k`` largest of its row; 0 (or ``top_k`` at
    least the vocabulary) keeps every logit.

    Exactly ``top_k`` logits are kept: ties at the boundary are broken by ``torch.topk``'s
    order, so which of two equal tokens is kept is not part of the contract.
    """
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}")
    if top_k == 0 or top_k >= logits.shape[-1]:
        return logits
    kept = torch.topk(logits, top_k, dim=-1).indices
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, kept, True)
    return logits.masked_fill(~keep, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the nucleus of mass ``top_p`` (per row).

    The nucleus is the smallest set of highest-probability tokens whose total probability is
    at least ``top_p``; the most likely token is always kept. Ties at the boundary are broken by
    the sort order, so the kept set is exactly the smallest one.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; returns ``(token_ids [batch], logprobs [batch])``.

    The draw: temperature, then top-k (0: off), then top-p within the kept tokens. ``logprobs``
    is ``log_softmax(logits / temperature)`` at the drawn token (before top-k and top-p).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    scaled = scale_logits(logits, temperature)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    if temperature == 0.0:
        tokens = torch.argmax(scaled, dim=-1)
    else:
        probs = torch.softmax(top_p_filter(top_k_filter(scaled, top_k), top_p), dim=-1)
        tokens = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    logprobs = logprobs_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, logprobs
