"""Request bodies: prompt lengths and ids, arith items, determinism."""

import random

import pytest

from hybridflow.loadgen.config import RewardLoadConfig, RolloutLoadConfig
from hybridflow.loadgen.workload import (
    random_prompt,
    reward_item_pool,
    rollout_prompt_pool,
    sampling_params,
)


def test_prompts_have_lengths_in_range_and_ids_in_vocab_without_eos():
    cfg = RolloutLoadConfig(prompt_len_min=3, prompt_len_max=9, prompts_per_request=4)
    pool = rollout_prompt_pool(cfg, vocab_size=6, eos_token_id=2, seed=0, size=50)
    assert len(pool) == 50 and all(len(body) == 4 for body in pool)
    lengths = {len(p) for body in pool for p in body}
    assert lengths == set(range(3, 10))  # 200 draws cover every length
    ids = {t for body in pool for p in body for t in p}
    assert ids == {0, 1, 3, 4, 5}
    assert pool == rollout_prompt_pool(cfg, vocab_size=6, eos_token_id=2, seed=0, size=50)


def test_fixed_prompt_length():
    cfg = RolloutLoadConfig(prompt_len_min=5, prompt_len_max=5)
    pool = rollout_prompt_pool(cfg, vocab_size=100, eos_token_id=99, seed=1, size=10)
    assert {len(p) for body in pool for p in body} == {5}


def test_eos_outside_vocab_excludes_nothing_and_tiny_vocab_is_refused():
    ids = set(random_prompt(random.Random(0), 400, vocab_size=3, eos_token_id=-1))
    assert ids == {0, 1}  # vocab_size - 1 ids drawn, nothing shifted
    with pytest.raises(ValueError, match="vocab_size"):
        random_prompt(random.Random(0), 1, vocab_size=1, eos_token_id=0)


def test_sampling_params_follow_config():
    p = sampling_params(RolloutLoadConfig(temperature=0.0, top_p=0.9, max_new_tokens=7, n=3))
    assert (p.temperature, p.top_p, p.max_new_tokens, p.n) == (0.0, 0.9, 7, 3)


@pytest.mark.parametrize(("fraction", "num_correct"), [(1.0, 30), (0.0, 0)])
def test_reward_items_are_arith_with_chosen_correctness(fraction, num_correct):
    cfg = RewardLoadConfig(items_per_request=3, correct_fraction=fraction, max_operand=9)
    pool = reward_item_pool(cfg, seed=4, size=10)
    assert len(pool) == 10 and all(len(body) == 3 for body in pool)
    items = [it for body in pool for it in body]
    assert all(it.data_source == "arith" for it in items)
    for it in items:
        a, b = it.prompt.rstrip("=").split("+")
        assert it.ground_truth == str(int(a) + int(b))
    assert sum(it.response == it.ground_truth for it in items) == num_correct
