"""The resolved config a checkpoint was taken with, and the resume check against it.

Each checkpoint directory ``step_<s>/`` gets ``config.json``: the job's resolved config
(``dataclasses.asdict`` of its ``JobConfig``, addresses included), written before
``coordinator.json`` and covered by the checkpoint's manifest. A resume compares the
resuming job's config with it (``resume_policy.compare``): the launcher before it starts any
service (an instant refusal), the coordinator again against the checkpoint it actually
restores (a config refusal ends the resume: an older checkpoint is no way round it). A checkpoint
from before this file existed has none: its changes go unchecked (logged).

Knows files and the policy; not services, not the schedule.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybridflow.coordinator.checkpoint import CheckpointStore
from hybridflow.coordinator.resume_policy import ResumeDecision, compare
from hybridflow.errors import CheckpointCorrupt

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"


class ResumeRefused(ValueError):
    """The resuming job changes a key the checkpoint cannot honour (one line names it)."""


def write_checkpoint_config(step_dir: Path, config: Mapping[str, Any]) -> None:
    """Writes ``step_dir/config.json`` atomically (before the checkpoint is committed)."""
    path = step_dir / CONFIG_FILE
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(config, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_checkpoint_config(step_dir: Path) -> dict[str, Any] | None:
    """The config the checkpoint in ``step_dir`` was taken with; None when it has none."""
    path = step_dir / CONFIG_FILE
    if not path.is_file():
        return None
    loaded = json.loads(path.read_text())
    if not isinstance(loaded, dict):
        raise ResumeRefused(f"{path}: not a JSON object")
    return loaded


def decide(step_dir: Path, new_config: Mapping[str, Any]) -> ResumeDecision | None:
    """The resume decision against the checkpoint in ``step_dir`` (None: it saved no config).
    ResumeRefused (one line, naming the checkpoint) when a change cannot be honoured."""
    old = read_checkpoint_config(step_dir)
    if old is None:
        log.warning("%s has no %s: config changes on resume are not checked", step_dir, CONFIG_FILE)
        return None
    decision = compare(old, new_config)
    refusal = decision.refusal()
    if refusal is not None:
        raise ResumeRefused(f"{refusal} [checkpoint {step_dir}]")
    for change in decision.accepted:
        if not change.rule.routine:
            log.info("resume: %s (%s)", change.describe(), change.rule.why)
    return decision


def check_resume_config(checkpoint_dir: Path, config: Mapping[str, Any]) -> ResumeDecision | None:
    """The launcher's check, before any service starts: the resuming job's resolved
    ``config`` (``dataclasses.asdict`` of its ``JobConfig``) against the newest checkpoint
    under ``checkpoint_dir`` whose small files verify (the shards are the learner's to check
    when it loads them). None when there is none or it saved no config."""
    store = CheckpointStore(checkpoint_dir)
    for step in store.candidates():  # newest first, as the coordinator's resume
        try:
            store.verify(step)
        except CheckpointCorrupt:
            continue  # the coordinator says so and falls back; the next one's config counts
        return decide(store.directory(step), config)
    return None
