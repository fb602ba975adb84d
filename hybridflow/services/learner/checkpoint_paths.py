"""Where a checkpoint RPC may write: a relative name resolved inside one root directory.

Pure path logic (no torch, no grpc): absolute names, ``..`` and symlinks that lead out of the
root are refused, so a caller of the learner's RPCs cannot write or read elsewhere.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


def resolve_checkpoint_target(root: str | Path, name: str) -> Path:
    """``root/name`` resolved; ValueError naming the problem when it is not inside ``root``."""
    if not str(root):
        raise ValueError(
            "learner.checkpoint_dir is not set: checkpoint RPCs are disabled "
            "(deploy/launch.sh sets it to <run dir>/checkpoints)"
        )
    if not name:
        raise ValueError("checkpoint name: required")
    pure = PurePosixPath(name)
    if pure.is_absolute() or "\\" in name or any(part in ("..", "") for part in pure.parts):
        raise ValueError(f"checkpoint name {name!r}: must be a relative path without '..'")
    base = Path(root).resolve()
    target = (base / pure).resolve()
    if not target.is_relative_to(base) or target == base:
        raise ValueError(f"checkpoint name {name!r}: resolves outside learner.checkpoint_dir")
    return target
