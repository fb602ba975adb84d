"""Epoch-aware prompt cursor: a seeded shuffle per epoch, position checkpointable.

Invariant: within one epoch every row is handed out exactly once, in the epoch's order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class CursorState:
    """Where the cursor stands (what a coordinator checkpoint stores)."""

    epoch: int = 0
    position: int = 0


class PromptCursor(Generic[T]):
    def __init__(self, rows: Sequence[T], seed: int, state: CursorState | None = None) -> None:
        if not rows:
            raise ValueError("the prompt dataset is empty")
        self._rows = rows
        self._seed = seed
        self.state = state or CursorState()
        self._order = self._epoch_order(self.state.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._rows)))
        random.Random(self._seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, num: int) -> list[T]:
        """The next ``num`` rows, rolling into the next epoch when this one runs out."""
        out: list[T] = []
        while len(out) < num:
            if self.state.position == len(self._order):
                self.state = CursorState(self.state.epoch + 1, 0)
                self._order = self._epoch_order(self.state.epoch)
            out.append(self._rows[self._order[self.state.position]])
            self.state.position += 1
        return out
