"""Checks every engine runs on a generation request before any work starts (pure, no torch)."""

from __future__ import annotations

from collections.abc import Sequence

from hybridflow.types import SamplingParams


def check_token_request(
    prompts: Sequence[Sequence[int]], params: SamplingParams, vocab_size: int
) -> None:
    """ValueError naming the first bad field: sampling params, stop tokens or prompt ids."""
    params.validate()
    for i, stop in enumerate(params.stop_token_ids):
        if not 0 <= stop < vocab_size:
            raise ValueError(f"sampling.stop_token_ids[{i}]={stop} outside [0, {vocab_size})")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}] is empty")
        bad = [t for t in prompt if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(f"prompts[{i}] has token id {bad[0]} outside [0, {vocab_size})")
