"""DAPO's overlong reward shaping: a soft penalty as a response nears ``max_new_tokens``.

Pure arithmetic on response lengths; the caller adds it to the scores before estimating
advantages. Nothing here knows about the sampler that set the length limit.
"""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty_factor: float
) -> torch.Tensor:
    """Per-sample penalty ``min(0, -(len - (max_new_tokens - buffer)) / buffer * factor)``.

    0 for responses of at most ``max_new_tokens - buffer`` tokens, falling linearly to
    ``-penalty_factor`` at ``max_new_tokens`` (verl's ``overlong_buffer`` in the DAPO reward
    manager). ``lengths [B]`` are response token counts.
    """
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(f"overlong buffer must be in [1, {max_new_tokens}], got {buffer}")
    expected = max_new_tokens - buffer
    exceed = lengths.float() - expected
    return torch.clamp(-exceed / buffer * penalty_factor, max=0.0)
