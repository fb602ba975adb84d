"""Epoch-aware prompt cursor: a seeded shuffle per epoch, position checkpointable.

Invariant: within one epoch every row is handed out exactly once, in the epoch's order.
Each hand-out is stamped (``Handout``) with its epoch and global sequence number, so the
coordinator can tell what was handed out but not trained when it checkpoints, and an audit
can count each prompt once per epoch.

Not thread-safe by itself: its owner is the job's ``GroupBuffer``. Dispatchers take
hand-outs only inside ``GroupBuffer.admit``, under the buffer's lock, and a checkpoint reads
the position under the same lock (``schedule_state.capture_schedule``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from hybridflow.arrays import TokenArray

T = TypeVar("T")


@dataclass
class CursorState:
    """Where the cursor stands (what a coordinator checkpoint stores)."""

    epoch: int = 0
    position: int = 0


@dataclass(eq=False)
class Handout:
    """A dataset row as handed out: its fields (the dataflow's ``Prompt``) plus where it
    stands in the run. Identity matters (a re-queued hand-out is the same object)."""

    prompt_text: str
    prompt_ids: TokenArray
    data_source: str
    ground_truth: str | None
    extra_info: dict[str, Any]
    index: int
    """Row index in the dataset (stable across restarts)."""
    epoch: int
    """Pass over the dataset this hand-out belongs to."""
    seq: int
    """Global hand-out number: epoch * dataset size + position in the epoch's order."""
    task_prompt: str = ""
    """The row's own prompt before the chat template (``PromptRecord.task_prompt``): what a
    multi-turn episode's environment is reset with. Without it the environment would get
    the rendered ChatML text as its user message, and the policy a doubled template."""

    @classmethod
    def of(cls, row: Any, epoch: int, seq: int) -> Handout:
        return cls(
            row.prompt_text,
            row.prompt_ids,
            row.data_source,
            row.ground_truth,
            row.extra_info,
            row.index,
            epoch,
            seq,
            str(getattr(row, "task_prompt", "") or ""),
        )


class PromptCursor(Generic[T]):
    """Hands out the dataset's rows in a seeded order, epoch after epoch, and takes back
    those not trained (a failed request, a resume) to hand out again first; its ``state`` is
    what a checkpoint saves."""

    def __init__(self, rows: Sequence[T], seed: int, state: CursorState | None = None) -> None:
        if not rows:
            raise ValueError("the prompt dataset is empty")
        self._rows = rows
        self._seed = seed
        self.state = state or CursorState()
        self._order = self._epoch_order(self.state.epoch)
        self._by_index: dict[int, int] | None = None

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._rows)))
        random.Random(self._seed * 1_000_003 + epoch).shuffle(order)
        return order

    def restore(self, state: CursorState) -> None:
        """Continues from a checkpointed position."""
        if not 0 <= state.position <= len(self._rows):
            raise ValueError(
                f"checkpointed cursor position {state.position} does not fit a dataset of "
                f"{len(self._rows)} rows (was the dataset changed?)"
            )
        self.state = CursorState(state.epoch, state.position)
        self._order = self._epoch_order(state.epoch)

    def take(self, num: int) -> list[T]:
        """The next ``num`` rows, rolling into the next epoch when this one runs out."""
        return [self._rows[i] for _, _, i in self._advance(num)]

    def take_handouts(self, num: int) -> list[Handout]:
        """Like ``take``, each row stamped with its epoch and sequence number."""
        return [Handout.of(self._rows[i], epoch, seq) for epoch, seq, i in self._advance(num)]

    def _advance(self, num: int) -> list[tuple[int, int, int]]:
        """(epoch, seq, row position in ``rows``) of the next ``num`` hand-outs."""
        out: list[tuple[int, int, int]] = []
        while len(out) < num:
            if self.state.position == len(self._order):
                self.state = CursorState(self.state.epoch + 1, 0)
                self._order = self._epoch_order(self.state.epoch)
            epoch, position = self.state.epoch, self.state.position
            out.append((epoch, epoch * len(self._rows) + position, self._order[position]))
            self.state.position += 1
        return out

    def handout(self, index: int, epoch: int, seq: int) -> Handout:
        """Rebuilds a hand-out of the row with dataset ``index`` (resume)."""
        if self._by_index is None:
            self._by_index = {getattr(row, "index", i): i for i, row in enumerate(self._rows)}
        if index not in self._by_index:
            raise ValueError(f"checkpointed prompt index {index} is not in the dataset")
        return Handout.of(self._rows[self._by_index[index]], epoch, seq)
