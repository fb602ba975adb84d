"""The built-in models (``builtin:tiny``, ``builtin:tiny-random``, ``builtin:tiny-qwen3``,
``builtin:tiny-tools``, ``builtin:tiny-code``, ``builtin:tiny-rm``): shipped weights, pinned by sha256, and the cache users load them from.

Training a model gives different floats on different CPUs (vector widths, oneDNN and MKL code
paths), and a few hundred steps amplify the difference: a reward model built on one machine
ranked right sums above wrong ones, built on another it did the opposite. So nothing is built
on a user's machine. The weights were built once (``make builtins``:
``hybridflow/builtins_build/``, behind its quality gates) and ship with the package under
``shipped/<name>/``, each file's sha256 in ``shipped/manifest.json`` with the spec hash the
build came from and the quality it measured.

``ensure_builtin_model(name)`` copies the shipped files into the cache
(``$HYBRIDFLOW_HOME/models/<name>-<digest>``, else ``~/.cache/hybridflow/models/...``; the
digest is of the files' hashes, so new weights get a new directory) and checks every file's
hash on each call. A cached copy that does not match is replaced, with one warning line; a
shipped file that does not match its manifest is refused, naming the file. Concurrent callers
are serialised by a file lock, and the directory appears by an atomic rename, so no caller
sees a half-written checkpoint.

This module knows nothing about services, RL or rewards.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hybridflow.models.builtin_code import CodeBuiltinSpec
from hybridflow.models.builtin_policy import POLICY_SPECS, BuiltinSpec
from hybridflow.models.builtin_rm import REWARD_SPECS, RewardModelSpec
from hybridflow.models.builtin_tools import ToolsBuiltinSpec

AnySpec = BuiltinSpec | ToolsBuiltinSpec | CodeBuiltinSpec | RewardModelSpec
"""A spec of any built-in kind."""

log = logging.getLogger(__name__)

BUILD_FORMAT_VERSION = 1
"""Bump when the build procedure changes in a way the spec fields do not capture."""

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
"""The built-ins' weights as they ship: ``<name>/`` checkpoints and ``manifest.json``."""

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class ShippedModel:
    """One built-in as the manifest pins it."""

    name: str
    spec_hash: str
    """``spec_hash`` of the spec the weights were built from."""
    files: dict[str, str]
    """File name -> sha256 hex digest: exactly the checkpoint's files."""
    quality: dict[str, float]
    """What ``builtins_build.quality.measure`` found when the weights were built."""
    built_on: str = ""
    """The machine that built them (informational)."""

    @property
    def digest(self) -> str:
        """Short hash of all the files' hashes: names the cache directory."""
        lines = "".join(f"{name}:{sha}\n" for name, sha in sorted(self.files.items()))
        return hashlib.sha256(lines.encode()).hexdigest()[:12]


def builtin_specs() -> dict[str, AnySpec]:
    """Every built-in name and the spec it is built from."""
    return {**POLICY_SPECS, **REWARD_SPECS}


def builtin_names() -> list[str]:
    """Every built-in model name: policies and reward models."""
    return sorted(builtin_specs())


def spec_hash(spec: AnySpec) -> str:
    """Short stable hash of a spec and the build format version."""
    payload = json.dumps({"v": BUILD_FORMAT_VERSION, **asdict(spec)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(shipped_dir: Path = SHIPPED_DIR) -> dict[str, ShippedModel]:
    """The manifest's entries by name."""
    raw: dict[str, dict[str, Any]] = json.loads((shipped_dir / MANIFEST_NAME).read_text())
    return {name: ShippedModel(name=name, **entry) for name, entry in raw.items()}


def write_manifest(entries: dict[str, ShippedModel], shipped_dir: Path = SHIPPED_DIR) -> None:
    """Writes the manifest (sorted, one stable layout, so diffs show what changed)."""
    raw = {name: {k: v for k, v in asdict(e).items() if k != "name"} for name, e in entries.items()}
    text = json.dumps(dict(sorted(raw.items())), indent=2, sort_keys=True) + "\n"
    (shipped_dir / MANIFEST_NAME).write_text(text)


def mismatches(directory: Path, files: dict[str, str]) -> list[str]:
    """What differs between ``directory`` and the pinned ``files`` (empty: identical)."""
    if not directory.is_dir():
        return [f"{directory} does not exist"]
    present = {p.name for p in directory.iterdir() if p.is_file()}
    problems = [f"{name} is missing" for name in sorted(set(files) - present)]
    problems += [f"{name} is not part of it" for name in sorted(present - set(files))]
    for name in sorted(set(files) & present):
        actual = file_sha256(directory / name)
        if actual != files[name]:
            problems.append(f"{name} has sha256 {actual[:12]}, expected {files[name][:12]}")
    return problems


def default_models_root() -> Path:
    """``$HYBRIDFLOW_HOME/models`` when set, else ``~/.cache/hybridflow/models``."""
    home = os.environ.get("HYBRIDFLOW_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "hybridflow"
    return base / "models"


def ensure_builtin_model(
    name: str = "tiny", root: str | Path | None = None, shipped_dir: Path = SHIPPED_DIR
) -> Path:
    """Path of the built-in model ``name`` in the cache under ``root``, copied from the shipped
    weights when the cache has no copy or a copy that does not match them."""
    entries = read_manifest(shipped_dir)
    if name not in entries:
        raise ValueError(f"unknown builtin model {name!r}; known: {sorted(entries)}")
    entry = entries[name]
    models_root = Path(root) if root is not None else default_models_root()
    target = models_root / f"{name}-{entry.digest}"
    if not mismatches(target, entry.files):
        return target
    models_root.mkdir(parents=True, exist_ok=True)
    with open(models_root / f".{target.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            problems = mismatches(target, entry.files)
            if not problems:
                return target
            if target.exists():
                log.warning(
                    "cached builtin:%s at %s does not match this version's weights (%s): "
                    "replacing it",
                    name,
                    target,
                    "; ".join(problems),
                )
            _install(entry, shipped_dir / name, models_root, target)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return target


def _install(entry: ShippedModel, source: Path, models_root: Path, target: Path) -> None:
    """Copies the shipped checkpoint to ``target`` by way of a private temp dir and a rename."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=models_root))
    try:
        for file_name in entry.files:
            shutil.copyfile(source / file_name, tmp / file_name)
        problems = mismatches(tmp, entry.files)
        if problems:
            raise RuntimeError(
                f"the shipped builtin:{entry.name} in {source} does not match its manifest "
                f"({'; '.join(problems)}): reinstall hybridflow, or rebuild with `make builtins`"
            )
        move_into_place(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def move_into_place(tmp: Path, target: Path) -> None:
    """A finished build in the private temp dir ``tmp`` becomes the cache entry ``target``:
    made readable (mkdtemp is private; the cache is meant to be readable), any old ``target``
    removed, then one rename."""
    for child in tmp.iterdir():
        child.chmod(0o644)
    tmp.chmod(0o755)
    if target.exists():
        shutil.rmtree(target)
    os.rename(tmp, target)
