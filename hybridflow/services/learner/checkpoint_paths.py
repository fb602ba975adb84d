"""Where a requested checkpoint may be written: only inside the run's checkpoint directory.

Pure path logic (no torch, no grpc): ``resolve_checkpoint_target`` turns a client-supplied
name into a path under the root, or raises. Used by the learner's SaveCheckpoint and by any
code that restores from a named checkpoint.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from hybridflow.errors import AlreadyExists, FailedPrecondition

MAX_NAME_BYTES = 1024


def resolve_checkpoint_target(root: str | Path, name: str, *, must_exist: bool = False) -> Path:
    """``root / name`` resolved, after checking that ``name`` is a safe relative name.

    ValueError when ``name`` is empty, absolute, contains ``..``, ``.`` or empty components, a
    backslash or a NUL, or resolves (through symlinks) outside ``root``. ``AlreadyExists``
    when the target exists and ``must_exist`` is false (a save never overwrites);
    FileNotFoundError when it is missing and ``must_exist`` is true (a restore).
    """
    if not str(root):
        raise FailedPrecondition(
            "learner.checkpoint_dir is not set: checkpoint RPCs are disabled "
            "(deploy/launch.sh sets it to <run dir>/checkpoints)"
        )
    if not name:
        raise ValueError("checkpoint path: required (a name relative to learner.checkpoint_dir)")
    if "\x00" in name or "\\" in name:
        raise ValueError(f"checkpoint path {name!r}: NUL and backslash are not allowed")
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise ValueError(
            f"checkpoint path {name!r}: must be relative to learner.checkpoint_dir, not absolute"
        )
    parts = name.split("/")
    if len(name.encode()) > MAX_NAME_BYTES or any(len(p.encode()) > 255 for p in parts):
        raise ValueError(
            f"checkpoint path of {len(name.encode())} bytes: at most {MAX_NAME_BYTES} bytes "
            "and 255 per component"
        )
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(
            f"checkpoint path {name!r}: '..', '.' and empty components are not allowed"
        )
    base = Path(root).resolve()
    target = (base / name).resolve()
    if target == base or not target.is_relative_to(base):
        raise ValueError(f"checkpoint path {name!r} resolves outside learner.checkpoint_dir")
    exists = target.exists() or (base / name).is_symlink()
    if must_exist and not exists:
        raise FileNotFoundError(f"checkpoint {name!r} not found under {base}")
    if not must_exist and exists:
        raise AlreadyExists(f"checkpoint {name!r} already exists under {base}; not overwriting")
    return target
