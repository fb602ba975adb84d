"""Which samples of an RL batch the online preference presets train on (index math only).

- Online DPO (``learner.algorithm: dpo``): per group (samples of one prompt share a group id)
  the highest-reward response is ``chosen`` and the lowest-reward one ``rejected``; ties go to
  the first in batch order. A group whose rewards are all equal (a single sample included)
  gives no pair and is counted as tied.
- RFT (``learner.algorithm: rft``, rejection-sampling fine-tuning): the samples whose reward
  is ``>= threshold``.

Knows nothing about tokens, tensors or models: inputs are rewards and group ids in batch order,
outputs are batch indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PairSelection:
    """Online DPO pairs of one batch."""

    pairs: list[tuple[int, int]]
    """``(chosen, rejected)`` batch indices, one per group with unequal rewards, in the order of
    each group's first sample."""
    num_tied_groups: int
    """Groups that gave no pair: all their rewards equal."""


def best_worst_pairs(rewards: Sequence[float], group_ids: Sequence[int]) -> PairSelection:
    """Each group's (highest-reward, lowest-reward) sample; first in batch order on ties."""
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards for {len(group_ids)} group ids")
    groups: dict[int, list[int]] = {}
    for index, group in enumerate(group_ids):
        groups.setdefault(group, []).append(index)
    pairs: list[tuple[int, int]] = []
    num_tied = 0
    for members in groups.values():
        # max / min return the first extreme element: the tie-break by batch order.
        best = max(members, key=lambda i: rewards[i])
        worst = min(members, key=lambda i: rewards[i])
        if rewards[best] == rewards[worst]:
            num_tied += 1
        else:
            pairs.append((best, worst))
    return PairSelection(pairs, num_tied)


def rft_kept(rewards: Sequence[float], threshold: float) -> list[int]:
    """Batch indices of the samples with ``reward >= threshold``, in batch order."""
    return [i for i, reward in enumerate(rewards) if reward >= threshold]
