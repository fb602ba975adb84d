"""The coordinator's half of a checkpoint, and which checkpoints are complete.

A checkpoint of step ``s`` is the directory ``<root>/step_<s>/`` holding
- ``learner/``: the learner's train state (weights, optimizer, RNG of every rank), written by
  the learner's ``SaveTrainState`` and marked complete by its own ``COMPLETE`` file;
- ``coordinator.json``: the schedule's state (below), written atomically after the learner's;
- ``MANIFEST.json``: size and sha256 of ``coordinator.json`` and of the learner's own
  ``learner/MANIFEST.json`` (which covers every shard), written last and atomically
  (``hybridflow.utils.manifest``).
A checkpoint is complete when its manifest is there; one without ``coordinator.json`` is a
save cut short (a crash) and is ignored, then removed; one with ``coordinator.json`` but no
manifest (cut short at the very end, or written before manifests) is kept and refused. The
last ``keep_last`` complete checkpoints are kept.

``verify(step)`` checks the coordinator's half and that the learner's manifest is the one
committed (a few small files, cheap); the learner checks its shards against its manifest
when it loads them, so a resume reads each byte once. ``verify(step, deep=True)`` (the
``verify`` command) checks the shards too.

The coordinator's state is what continuing needs: the cursor (epoch, position), every prompt
handed out and not trained (in flight, scored-but-untrained, re-queued: all regenerated on
resume, in hand-out order), the admission count, the step and version, the per-step rewards
and counters of the summary. The run's logs (metrics.jsonl, trained.jsonl) are rewound to the
checkpoint's step on resume, so a step trained after the checkpoint and lost with the crash is
trained again exactly once. Knows nothing of gRPC or the learner's file layout.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hybridflow.errors import CheckpointCorrupt, ResourceExhausted
from hybridflow.utils import manifest
from hybridflow.utils.disk import disk_full_message, is_disk_full

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{8})$")
STATE_FILE = "coordinator.json"
LEARNER_DIR = "learner"
_LEARNER_MANIFEST = f"{LEARNER_DIR}/{manifest.MANIFEST}"


@dataclass
class CoordinatorState:
    """The schedule's half of a checkpoint: step, versions, the data cursor and every prompt
    handed out and not yet trained, so a resume trains each prompt of an epoch exactly once."""

    step: int
    """Last trained step."""
    policy_version: int
    """Learner policy version after that step."""
    versions_per_step: int
    """Optimizer steps per train step (measured at step 1)."""
    cursor_epoch: int
    cursor_position: int
    pending: list[list[int]]
    """[epoch, dataset index, hand-out seq] of every prompt handed out and not trained."""
    num_started: int
    """Admission's count of started groups, the pending ones excluded (they restart)."""
    num_rows: int
    """Dataset size: a resume against another dataset is refused."""
    rewards: list[float] = field(default_factory=list)
    """Mean reward of each trained step (the summary's start and end)."""
    num_samples: int = 0
    num_requeued: int = 0
    num_dropped_stale: int = 0
    num_filtered: int = 0
    """Groups dynamic sampling did not train (their prompts consumed)."""
    num_passed_equal: int = 0
    staleness: dict[str, int] = field(default_factory=dict)
    learner_busy_s: float = 0.0
    wall_s: float = 0.0
    """Training wall time before this checkpoint (summed over restarts)."""


class CheckpointStore:
    """Complete / partial checkpoints under one root; commit, find the latest, prune."""

    def __init__(self, root: Path, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise ValueError("coordinator.keep_checkpoints must be >= 1")
        self.root = root
        self.keep_last = keep_last

    @staticmethod
    def step_name(step: int) -> str:
        return f"step_{step:08d}"

    def learner_name(self, step: int) -> str:
        """What the learner's SaveTrainState / LoadTrainState get (relative to its root)."""
        return f"{self.step_name(step)}/{LEARNER_DIR}"

    def directory(self, step: int) -> Path:
        return self.root / self.step_name(step)

    def is_complete(self, step: int) -> bool:
        """Every part written: the coordinator's manifest (written last) is there."""
        return (self.directory(step) / manifest.MANIFEST).exists()

    def verify(self, step: int, deep: bool = False) -> None:
        """Raises ``CheckpointCorrupt`` naming the first file of checkpoint ``step`` that is
        not as committed; ``deep``: the learner's shards too (else the learner checks them)."""
        directory = self.directory(step)
        if not (directory / STATE_FILE).exists():
            raise CheckpointCorrupt(f"{directory / STATE_FILE}: missing (a save cut short)")
        manifest.verify(directory)
        for name in (STATE_FILE, _LEARNER_MANIFEST):
            if name not in manifest.read_manifest(directory):
                raise CheckpointCorrupt(f"{directory / manifest.MANIFEST}: does not list {name}")
        if deep:
            manifest.verify(directory / LEARNER_DIR)

    def check(self, step: int) -> str | None:
        """One line saying why checkpoint ``step`` is refused (every file checked, the
        learner's shards included), or None when it verifies."""
        try:
            self.verify(step, deep=True)
            self.read_state(step)
        except CheckpointCorrupt as exc:
            return str(exc)
        return None

    def read_state(self, step: int) -> CoordinatorState:
        """The coordinator's state of checkpoint ``step`` (``CheckpointCorrupt`` if unreadable)."""
        path = self.directory(step) / STATE_FILE
        try:
            return CoordinatorState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise CheckpointCorrupt(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc

    def candidates(self) -> list[int]:
        """Steps a resume may continue from, newest first: every checkpoint with the
        coordinator's half written (whether it verifies is for ``verify`` to say)."""
        return [s for s in reversed(self.steps()) if (self.directory(s) / STATE_FILE).exists()]

    def steps(self) -> list[int]:
        """Steps with a checkpoint directory, complete or not, ascending."""
        if not self.root.is_dir():
            return []
        out = []
        for entry in self.root.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and entry.is_dir():
                out.append(int(match.group(1)))
        return sorted(out)

    def complete_steps(self) -> list[int]:
        return [s for s in self.steps() if self.is_complete(s)]

    def begin(self, step: int) -> None:
        """Before saving step ``step``: clears what a save cut short left there (e.g. the
        learner's half written before the coordinator died)."""
        directory = self.root / self.step_name(step)
        if directory.exists() and not self.is_complete(step):
            shutil.rmtree(directory)

    def discard_partial(self) -> None:
        """Resume: a checkpoint without the coordinator's half is a save the run that died
        cut short; remove them (one with it stays, for ``verify`` to judge)."""
        for step in self.steps():
            if not (self.directory(step) / STATE_FILE).exists():
                shutil.rmtree(self.directory(step), ignore_errors=True)

    def set_aside(self, step: int) -> Path:
        """Renames a refused checkpoint to ``step_<s>.refused`` (kept to look at, no longer a
        checkpoint: the steps after a fallback are saved again under their own names)."""
        target = self.root / f"{self.step_name(step)}.refused"
        if target.exists():
            shutil.rmtree(target)
        os.replace(self.directory(step), target)
        return target

    def commit(self, state: CoordinatorState, also: Sequence[str] = ()) -> Path:
        """Writes the coordinator's half after the learner's, then the manifest (which makes
        it complete). ``also``: files already written in the step directory that the
        manifest covers too (the resolved config). A full disk is ``ResourceExhausted``
        naming the path and free space."""
        directory = self.directory(state.step)
        if not (directory / _LEARNER_MANIFEST).exists():
            raise RuntimeError(f"{directory}: the learner's train state (its manifest) is missing")
        try:
            _atomic_write(directory / STATE_FILE, json.dumps(asdict(state)) + "\n")
            manifest.write_manifest(
                directory,
                manifest.hash_files(directory, [STATE_FILE, _LEARNER_MANIFEST, *also]),
            )
        except OSError as exc:
            if is_disk_full(exc):
                raise ResourceExhausted(disk_full_message(directory, exc)) from exc
            raise
        self.prune()
        return directory

    def latest(self) -> CoordinatorState | None:
        """The newest checkpoint's state that verifies (refused ones logged), or None."""
        for step in self.candidates():
            try:
                self.verify(step)
                return self.read_state(step)
            except CheckpointCorrupt as exc:
                log.warning("skipping checkpoint step %d: %s", step, exc)
        return None

    def prune(self) -> None:
        """Keeps the newest ``keep_last`` complete checkpoints; removes older ones and any
        partial one older than the newest complete."""
        complete = self.complete_steps()
        keep = set(complete[-self.keep_last :])
        newest = complete[-1] if complete else -1
        for step in self.steps():
            if step in keep or step > newest:
                continue  # a newer partial one may be a save in progress
            shutil.rmtree(self.root / self.step_name(step), ignore_errors=True)


def rewind_jsonl(path: Path, last_step: int) -> int:
    """Drops lines of a per-step JSONL log whose ``step`` is past ``last_step`` (steps trained
    after the checkpoint and lost with the crash); returns the lines kept."""
    if not path.exists():
        return 0
    kept = []
    for line in path.read_text().splitlines():
        try:
            step = int(json.loads(line).get("step", 0))
        except (ValueError, AttributeError):
            continue  # a line cut short by the crash
        if step <= last_step:
            kept.append(line)
    _atomic_write(path, "".join(f"{line}\n" for line in kept))
    return len(kept)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
