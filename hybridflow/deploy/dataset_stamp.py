"""Which dataset a preflight validated, so a launch reads the dataset file to check it once.

The rule: a launch validates its dataset once and loads it once. Under deploy/launch.sh the
launcher's preflight validates it (``preflight.dataset_problems``) and the coordinator it
starts only loads it; a coordinator started any other way (by hand, under Slurm or
Kubernetes: no launcher preflight ran) validates it itself, as before. What carries the
launcher's verdict is a stamp: the dataset spec, a digest of the other inputs of the check
(``coordinator.max_prompt_bytes`` and the ``reward`` section, which picks the scorers) and
the file's identity (device, inode, size, mtime_ns), taken before the preflight read it.
A clean check records the stamp in this process; the launcher hands the one for its job to
the coordinator in ``HYBRIDFLOW_DATASET_CHECKED`` (``checked_env``). The coordinator skips
the dataset check when that stamp equals the one of the file it is about to load
(``checked_by_launcher``); any difference (no stamp, other inputs, a file replaced,
rewritten or touched since, or one that cannot be stat'ed) and it validates again. A
builtin dataset has no file: its stamp is its name and inputs.

It reads file metadata only, never a row; it does not know what the check checks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from hybridflow.config.loader import to_dict
from hybridflow.data.datasets import is_generated
from hybridflow.data.sharegpt import SHAREGPT_PREFIX
from hybridflow.job_config import JobConfig

ENV = "HYBRIDFLOW_DATASET_CHECKED"
"""Set by the launcher on the coordinator it starts: the stamp its preflight validated."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetStamp:
    """One dataset as a check saw it: equal stamps, equal verdicts."""

    spec: str
    """``coordinator.data``."""
    inputs: str
    """sha256 of the check's other inputs (max_prompt_bytes, the reward section)."""
    file: tuple[int, int, int, int] | None
    """(st_dev, st_ino, st_size, st_mtime_ns) of the dataset file; None for a builtin."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DatasetStamp:
        """ValueError when ``text`` is not a stamp."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or set(raw) != {"spec", "inputs", "file"}:
            raise ValueError(f"not a dataset stamp: {text!r}")
        file = raw["file"]
        if file is None:
            return cls(str(raw["spec"]), str(raw["inputs"]), None)
        if not (isinstance(file, list) and len(file) == 4 and all(type(x) is int for x in file)):
            raise ValueError(f"not a dataset stamp: {text!r}")
        return cls(str(raw["spec"]), str(raw["inputs"]), (file[0], file[1], file[2], file[3]))


_validated: dict[tuple[str, str], DatasetStamp] = {}
"""The stamps this process's preflight validated cleanly, by (spec, inputs): the launcher's
preflight and its start of the coordinator are one process."""


def stamp(job: JobConfig) -> DatasetStamp | None:
    """The stamp of ``job``'s dataset now; None when its file cannot be stat'ed (the check
    then reports why)."""
    cfg = job.coordinator
    inputs = json.dumps([cfg.max_prompt_bytes, to_dict(job.reward)], sort_keys=True, default=str)
    digest = hashlib.sha256(inputs.encode()).hexdigest()
    if is_generated(cfg.data):  # made from the seed: nothing on disk to change
        return DatasetStamp(cfg.data, digest, None)
    path = Path(cfg.data.removeprefix(SHAREGPT_PREFIX))
    try:
        st = os.stat(path)
    except OSError:
        return None
    return DatasetStamp(cfg.data, digest, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


def record_validated(checked: DatasetStamp) -> None:
    """Notes that the dataset of stamp ``checked`` (taken before it was read) passed."""
    _validated[(checked.spec, checked.inputs)] = checked


def checked_env(job: JobConfig) -> dict[str, str]:
    """What the launcher adds to its coordinator's environment: the stamp of ``job``'s
    dataset as this process validated it; nothing when it did not validate it."""
    current = stamp(job)
    checked = _validated.get((current.spec, current.inputs)) if current is not None else None
    return {ENV: checked.to_json()} if checked is not None else {}


def checked_by_launcher(job: JobConfig, environ: Mapping[str, str] | None = None) -> bool:
    """True when the launcher's stamp (``environ``, default this process's) is the stamp of
    ``job``'s dataset now: the same file, unchanged, checked with the same inputs."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    if not raw:
        return False
    try:
        checked = DatasetStamp.from_json(raw)
    except ValueError as exc:  # json.JSONDecodeError is one
        log.warning("ignoring %s: %s; validating the dataset", ENV, exc)
        return False
    current = stamp(job)
    if current != checked:
        log.info(
            "the dataset (or what its check depends on) changed since the launcher's "
            "preflight: validating it again"
        )
        return False
    log.info(
        "dataset %s: validated by the launcher's preflight, unchanged since", job.coordinator.data
    )
    return True
