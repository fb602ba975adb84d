"""A running job's checkpoints: saving one, and restoring from the newest that fits.

A checkpoint is the learner's train state and the schedule's state saved together
(``checkpoint.py`` lays them out on disk, ``schedule_state.py`` captures and restores the
schedule's half), plus the resolved config it was taken with (``checkpoint_config.py``).
Saving waits for the publish in flight (the state saved says which step is out) and holds
the learner's lock. Restoring tries the candidates newest first: one that is damaged, or
does not fit this learner, is logged with its reason and the next older tried; the newer
refused ones are set aside once one fits, and if every one is refused nothing is loaded and
the resume fails naming each (docs/checkpoints.md). A config change a checkpoint cannot
honour ends the resume (``resume_policy.py``, docs/resume.md), before the learner loads
anything; a new ``prompts_per_step`` rebases the admission count. The run's logs
(metrics.jsonl, trained.jsonl) are rewound to the restored step.

It owns no schedule: the step loop (``job.py``) hands it the buffer, cursor, publisher and
event log it shares, and decides when to save.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybridflow.coordinator.buffer import GroupBuffer
from hybridflow.coordinator.checkpoint import CheckpointStore, CoordinatorState, rewind_jsonl
from hybridflow.coordinator.checkpoint_config import (
    CONFIG_FILE,
    decide,
    write_checkpoint_config,
)
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.events import EventLog
from hybridflow.coordinator.publish import WeightPublisher
from hybridflow.coordinator.resume_policy import rebased_num_started
from hybridflow.coordinator.schedule_state import capture_schedule, restore_schedule
from hybridflow.coordinator.services import Services
from hybridflow.errors import CheckpointRejected, FailedPrecondition

log = logging.getLogger(__name__)


class JobCheckpoints:
    """Saves and restores one job's checkpoints under ``store``; the learner is reached
    through ``services`` under the publisher's lock."""

    def __init__(
        self,
        store: CheckpointStore,
        services: Services,
        publisher: WeightPublisher,
        buffer: GroupBuffer,
        cursor: PromptCursor,
        events: EventLog,
        run_dir: Path,
        resolved_config: Mapping[str, Any],
        num_rows: int,
    ) -> None:
        """``resolved_config``: saved with each checkpoint and compared with it on resume;
        ``num_rows``: the dataset's size, which a checkpoint must have been taken with."""
        self.store = store
        self.services = services
        self.publisher = publisher
        self.buffer = buffer
        self.cursor = cursor
        self.events = events
        self.run_dir = run_dir
        self.resolved_config = resolved_config
        self.num_rows = num_rows

    def restore(self) -> CoordinatorState | None:
        """Continues from the newest checkpoint that verifies and fits (if any): learner
        state, cursor, pending prompts first in line, counters; logs rewound to its step.
        Returns its state, or None (logs rewound to the start) when there is none.
        A refused checkpoint (damaged, or not fitting this learner) is logged with its reason
        and set aside, and the next older one is tried; if every one is refused, nothing is
        loaded and the resume fails naming each."""
        store = self.store
        store.discard_partial()
        refused: list[str] = []
        for step in store.candidates():  # newest first
            try:
                state, version = self._load(step)
            except FailedPrecondition as exc:  # CheckpointRejected / Corrupt, ours or the learner's
                log.warning("resume: refusing checkpoint step %d: %s", step, exc)
                refused.append(f"step {step}: {exc}")
                continue
            break
        else:
            if refused:
                raise CheckpointRejected(
                    f"resume: no checkpoint under {store.root} verifies and fits "
                    f"this job ({'; '.join(refused)})"
                )
            log.info("resume: no complete checkpoint under %s; starting at step 1", store.root)
            rewind_jsonl(self.run_dir / "metrics.jsonl", 0)
            rewind_jsonl(self.run_dir / "trained.jsonl", 0)
            rewind_jsonl(self.run_dir / "eval.jsonl", 0)
            return None
        if refused:
            for newer in store.candidates():
                if newer > state.step:
                    store.set_aside(newer)
            log.warning(
                "resume: fell back to checkpoint step %d, the newest that verifies and fits "
                "(%d newer refused, set aside as step_*.refused)",
                state.step,
                len(refused),
            )
        num_pending = restore_schedule(state, self.buffer, self.cursor)
        state.versions_per_step = self.buffer.bound.versions_per_step  # this learner's
        rewind_jsonl(self.run_dir / "metrics.jsonl", state.step)
        rewind_jsonl(self.run_dir / "trained.jsonl", state.step)
        rewind_jsonl(self.run_dir / "eval.jsonl", state.step)
        log.info(
            "resumed from step %d (policy v%d, %d prompts to regenerate)",
            state.step,
            version,
            num_pending,
        )
        return state

    def _load(self, step: int) -> tuple[CoordinatorState, int]:
        """Verifies checkpoint ``step``, then has the learner load its half (which checks its
        shards and its fit first); returns the state and the restored policy version."""
        store = self.store
        store.verify(step)
        state = store.read_state(step)
        # The config check: a refusal (ValueError) ends the resume, it is no fallback case.
        decision = decide(store.directory(step), self.resolved_config)
        batch = decision.changed("coordinator.prompts_per_step") if decision else None
        if batch is not None:
            state.num_started = rebased_num_started(
                state.num_started, state.step, int(batch.old), int(batch.new)
            )
        if state.num_rows != self.num_rows:
            raise ValueError(
                f"resume: the checkpoint was taken with {state.num_rows} prompts, the dataset "
                f"now has {self.num_rows}"
            )
        with self.publisher.learner_lock:
            version = self.services.learner.load_train_state(store.learner_name(step))
        if version != state.policy_version:
            raise RuntimeError(
                f"resume: learner restored version {version}, checkpoint says "
                f"{state.policy_version}"
            )
        return state, version

    def save(self, step: int, state: CoordinatorState, num_requeued: int) -> str:
        """Learner train state, then the schedule's state (which completes the checkpoint);
        the checkpoint's path (an already complete one is not written again)."""
        store = self.store
        self.publisher.join()  # the schedule state saved says which step is out
        if store.is_complete(step):
            return str(store.root / store.step_name(step))
        store.begin(step)
        with self.publisher.learner_lock:
            self.services.learner.save_train_state(store.learner_name(step))
        write_checkpoint_config(store.directory(step), self.resolved_config)
        capture_schedule(state, self.buffer, self.cursor, num_requeued)
        path = store.commit(state, also=[CONFIG_FILE])
        self.events.record("checkpoint", time.time(), time.time(), step=step)
        return str(path)

    def export_hf(self, step: int) -> str:
        """The learner's Hugging Face export of step ``step`` (``hf/step_<n>``): its path."""
        with self.publisher.learner_lock:
            return self.services.learner.save_checkpoint(f"hf/{self.store.step_name(step)}")
