"""Online DPO pair building and RFT filtering on hand-made rewards."""

import pytest

from hybridflow.algorithms.online_preference import best_worst_pairs, rft_kept


def test_each_group_gives_its_best_and_worst_sample() -> None:
    # group 7: rewards 0.2, 0.9, 0.1 at indices 0, 2, 4 -> (2, 4)
    # group 3: rewards 1.0, 0.0 at indices 1, 3 -> (1, 3); groups keep first-appearance order
    rewards = [0.2, 1.0, 0.9, 0.0, 0.1]
    groups = [7, 3, 7, 3, 7]
    selection = best_worst_pairs(rewards, groups)
    assert selection.pairs == [(2, 4), (1, 3)]
    assert selection.num_tied_groups == 0


def test_ties_go_to_the_first_in_batch_order() -> None:
    # One group: maxima at 1 and 3, minima at 0 and 2 -> chosen 1, rejected 0.
    selection = best_worst_pairs([0.0, 1.0, 0.0, 1.0], [5, 5, 5, 5])
    assert selection.pairs == [(1, 0)]


def test_equal_reward_groups_and_single_samples_give_no_pair_and_are_counted() -> None:
    rewards = [1.0, 1.0, 0.5, 0.5, 0.0, 1.0, 0.3]
    groups = [0, 0, 1, 1, 2, 2, 3]  # groups 0 and 1 tied, group 3 has one sample
    selection = best_worst_pairs(rewards, groups)
    assert selection.pairs == [(5, 4)]
    assert selection.num_tied_groups == 3


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="2 rewards for 3 group ids"):
        best_worst_pairs([0.0, 1.0], [0, 0, 1])


def test_rft_keeps_rewards_at_or_above_the_threshold() -> None:
    rewards = [1.0, 0.999999, 1.5, 0.0, 1.0]
    assert rft_kept(rewards, 1.0) == [0, 2, 4]
    assert rft_kept(rewards, 0.999999) == [0, 1, 2, 4]
    assert rft_kept(rewards, 1.5000001) == []
    assert rft_kept(rewards, -1.0) == [0, 1, 2, 3, 4]
