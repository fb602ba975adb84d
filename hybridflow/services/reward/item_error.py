"""``ItemError``: why one item of a batch could not be scored (its kind is an error counter).

Shared by the rule scorers (``scorers.py``) and the reward-model scorer (``model_scorer.py``):
a scorer returns or raises it for one item, never for the whole batch.
"""

from __future__ import annotations


class ItemError(Exception):
    """One item's failure: ``kind`` (a key of ``RewardScorer.error_counts``) and a message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
