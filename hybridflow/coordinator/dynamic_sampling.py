"""DAPO's dynamic sampling: a group whose rewards are all equal is not trained.

Under a group baseline (GRPO, RLOO, DAPO) such a group has zero advantage everywhere: it
costs a batch slot and teaches nothing. With ``coordinator.dynamic_sampling`` the buffer
hands each arriving group to ``GroupFilter.keep``; a filtered group frees its admission
slot, so a new prompt is generated in its place until the batch is full.

Nothing is lost: a filtered prompt is consumed like a trained one. It waits in the buffer
until the trainer loop writes it to ``trained.jsonl`` (``"filtered": true``) at the next
step; until then it is pending, so a checkpoint taken meanwhile regenerates it on resume.
The staleness bound is untouched: filtered groups never enter a batch, and the replacement
prompts pass the same admission rule and consumption check as any other.

A safety valve keeps a solved (or hopeless) task from starving the learner: once
``max_rounds`` batches' worth of groups were filtered since the last batch was taken, equal
groups are trained after all, and counted (``passed_equal``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridflow.coordinator.dataflow import ScoredGroup


def is_uninformative(group: ScoredGroup) -> bool:
    """All of the group's scores are equal (two or more completions)."""
    scores = [r.score for r in group.results]
    return len(scores) > 1 and max(scores) == min(scores)


class GroupFilter:
    """Decides per arriving group; counts what it filtered. Caller holds the buffer's lock."""

    def __init__(self, batch_groups: int, max_rounds: int) -> None:
        if batch_groups < 1 or max_rounds < 1:
            raise ValueError("GroupFilter: batch_groups and max_rounds must be >= 1")
        self.limit = batch_groups * max_rounds
        """Groups filtered between two taken batches before equal groups pass."""
        self.since_take = 0
        self.num_filtered = 0
        """Groups filtered over the run."""
        self.num_passed_equal = 0
        """Equal groups trained because the valve was open."""

    def keep(self, group: ScoredGroup) -> bool:
        """True: the group goes to the buffer; False: it is filtered (counted)."""
        if not is_uninformative(group):
            return True
        if self.since_take >= self.limit:
            self.num_passed_equal += 1
            return True
        self.since_take += 1
        self.num_filtered += 1
        return False

    def batch_taken(self) -> None:
        """A batch was taken: the valve closes again."""
        self.since_take = 0


def dynamic_sampling_metrics(
    group_filter: GroupFilter | None,
    batch: Sequence[ScoredGroup],
    filtered: Sequence[ScoredGroup],
) -> dict[str, float]:
    """A step's filtered groups, the mean score over its trained and filtered groups (the
    policy's reward; ``critic/score/mean`` is the trained batch's) and the run's totals.
    Empty without dynamic sampling."""
    if group_filter is None:
        return {}
    scores = [r.score for g in (*batch, *filtered) for r in g.results]
    return {
        "dynamic_sampling/filtered": float(len(filtered)),
        "dynamic_sampling/score_all_mean": sum(scores) / max(len(scores), 1),
        "dynamic_sampling/filtered_total": float(group_filter.num_filtered),
        "dynamic_sampling/passed_equal": float(group_filter.num_passed_equal),
    }
