"""The schedule's half of a checkpoint: what the live schedule puts into a ``CoordinatorState``
and takes back from one.

That is the cursor (epoch, position), the prompts handed out and not trained (regenerated on
resume, in hand-out order), the admission count and the counters the summary reports (stale
drops, re-queues, dynamic sampling, the staleness histogram). ``TrainingJob`` saves the
learner's half first and commits this one last (``checkpoint.py``). Knows the buffer, the
cursor and the state; not the learner, not files.
"""

from __future__ import annotations

from hybridflow.coordinator.buffer import GroupBuffer
from hybridflow.coordinator.checkpoint import CoordinatorState
from hybridflow.coordinator.cursor import CursorState, PromptCursor


def capture_schedule(
    state: CoordinatorState, buffer: GroupBuffer, cursor: PromptCursor, num_requeued: int
) -> None:
    """Write the live schedule into ``state`` (one consistent cut, under the buffer's lock)."""
    with buffer.lock:
        pending = buffer.pending()
        position = cursor.state
        state.cursor_epoch, state.cursor_position = position.epoch, position.position
        state.pending = [[p.epoch, p.index, p.seq] for p in pending]  # type: ignore[attr-defined]
        state.num_started = buffer.admission.num_started - len(pending)
    state.num_requeued = num_requeued
    state.num_dropped_stale = buffer.stats.dropped_stale
    if buffer.group_filter is not None:
        state.num_filtered = buffer.group_filter.num_filtered
        state.num_passed_equal = buffer.group_filter.num_passed_equal
    state.staleness = {str(k): v for k, v in buffer.stats.staleness.items()}


def restore_schedule(state: CoordinatorState, buffer: GroupBuffer, cursor: PromptCursor) -> int:
    """Put the schedule back as ``state`` left it; returns the number of prompts to regenerate
    (first in line)."""
    cursor.restore(CursorState(state.cursor_epoch, state.cursor_position))
    pending = [cursor.handout(index, epoch, seq) for epoch, index, seq in state.pending]
    buffer.restore(pending, state.num_started, state.step)
    buffer.stats.dropped_stale = state.num_dropped_stale
    if buffer.group_filter is not None:
        buffer.group_filter.num_filtered = state.num_filtered
        buffer.group_filter.num_passed_equal = state.num_passed_equal
    buffer.stats.staleness.update({int(k): v for k, v in state.staleness.items()})
    return len(pending)
