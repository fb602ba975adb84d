"""Checks every engine runs on a generation request before any work starts (pure, no torch),
the per-request limits the service applies before that, and how a cancelled request ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hybridflow.arrays import TokenLike, as_tokens
from hybridflow.types import SamplingParams


def check_token_request(
    prompts: Sequence[TokenLike], params: SamplingParams, vocab_size: int
) -> None:
    """ValueError naming the first bad field: sampling params, stop tokens or prompt ids."""
    params.validate()
    for i, stop in enumerate(params.stop_token_ids):
        if not 0 <= stop < vocab_size:
            raise ValueError(f"sampling.stop_token_ids[{i}]={stop} outside [0, {vocab_size})")
    for i, prompt in enumerate(prompts):
        ids = as_tokens(prompt)
        if ids.size == 0:
            raise ValueError(f"prompts[{i}] is empty")
        bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
        if bad.size:
            raise ValueError(
                f"prompts[{i}] has token id {int(ids[bad[0]])} outside [0, {vocab_size})"
            )


ShouldStop = Callable[[], bool]
"""Polled by the engine once per decode step: True when the caller has gone (cancelled or its
deadline expired); the engine then stops and raises ``Cancelled``."""


class Cancelled(Exception):
    """A generation request stopped because its caller went away."""

    def __init__(self, num_steps: int) -> None:
        super().__init__(f"generation cancelled by its caller after {num_steps} decode steps")
        self.num_steps = num_steps


@dataclass(frozen=True)
class RequestLimits:
    """The rollout.* per-request bounds (see RolloutConfig), checked before any work."""

    max_n: int = 64
    max_new_tokens_limit: int = 4096
    max_prompts_per_request: int = 1024
    max_tokens_per_request: int = 1 << 20


def check_request_limits(
    num_prompts: int, num_prompt_tokens: int, n: int, max_new_tokens: int, limits: RequestLimits
) -> None:
    """ValueError naming the rollout.* key a request exceeds. ``num_prompt_tokens`` is the sum
    over prompts; the token bound is n * (prompt tokens + num_prompts * max_new_tokens), the
    rows the engine would hold."""
    if n > limits.max_n:
        raise ValueError(f"sampling.n={n} exceeds rollout.max_n={limits.max_n}")
    if max_new_tokens > limits.max_new_tokens_limit:
        raise ValueError(
            f"sampling.max_new_tokens={max_new_tokens} exceeds "
            f"rollout.max_new_tokens_limit={limits.max_new_tokens_limit}"
        )
    if num_prompts > limits.max_prompts_per_request:
        raise ValueError(
            f"{num_prompts} prompts exceed rollout.max_prompts_per_request="
            f"{limits.max_prompts_per_request}"
        )
    total = max(n, 1) * (num_prompt_tokens + num_prompts * max(max_new_tokens, 0))
    if total > limits.max_tokens_per_request:
        raise ValueError(
            f"request needs {total} tokens (n * (prompt tokens + prompts * max_new_tokens)), "
            f"more than rollout.max_tokens_per_request={limits.max_tokens_per_request}"
        )
