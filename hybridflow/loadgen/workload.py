"""What each request contains: random prompts (rollout) or arith items (reward).

Pure and seeded: a pool of request bodies is built once before the run and cycled, so the
generator spends no time building requests while it measures. Produces domain types only;
``targets`` turns them into protos.
"""

from __future__ import annotations

import random

from hybridflow.data.arith import make_arith_rows
from hybridflow.loadgen.config import RewardLoadConfig, RolloutLoadConfig
from hybridflow.types import SamplingParams, ScoreItem

POOL_SIZE = 64
"""Distinct request bodies per run; request i uses body i % POOL_SIZE."""


def sampling_params(cfg: RolloutLoadConfig) -> SamplingParams:
    """The sampling parameters of every Generate request."""
    params = SamplingParams(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        n=cfg.n,
    )
    params.validate()
    return params


def random_prompt(rng: random.Random, length: int, vocab_size: int, eos_token_id: int) -> list[int]:
    """``length`` token ids uniform over [0, vocab_size) without ``eos_token_id``."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    skip = eos_token_id if 0 <= eos_token_id < vocab_size else vocab_size
    ids = [rng.randrange(vocab_size - 1) for _ in range(length)]
    return [i + 1 if i >= skip else i for i in ids]


def rollout_prompt_pool(
    cfg: RolloutLoadConfig, vocab_size: int, eos_token_id: int, seed: int, size: int = POOL_SIZE
) -> list[list[list[int]]]:
    """``size`` request bodies of ``prompts_per_request`` prompts each."""
    rng = random.Random(seed)
    return [
        [
            random_prompt(
                rng, rng.randint(cfg.prompt_len_min, cfg.prompt_len_max), vocab_size, eos_token_id
            )
            for _ in range(cfg.prompts_per_request)
        ]
        for _ in range(size)
    ]


def reward_item_pool(
    cfg: RewardLoadConfig, seed: int, size: int = POOL_SIZE
) -> list[list[ScoreItem]]:
    """``size`` request bodies of ``items_per_request`` arith items with random responses.

    A response is the ground truth with probability ``correct_fraction``, else a different
    number, so the service exercises both outcomes.
    """
    rng = random.Random(seed)
    rows = make_arith_rows(size * cfg.items_per_request, seed, cfg.max_operand)
    items = []
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        correct = rng.random() < cfg.correct_fraction
        response = truth if correct else str(int(truth) + rng.randint(1, 9))
        items.append(ScoreItem(row["data_source"], response, truth, prompt=row["prompt"]))
    step = cfg.items_per_request
    return [items[i : i + step] for i in range(0, len(items), step)]
