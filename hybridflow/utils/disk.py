"""Says what a full disk is: which path could not be written and how much space is left.

Pure (no torch, no grpc): used where an ``OSError`` with ``errno.ENOSPC`` (or EDQUOT, a user
quota) is turned into a message, by servicers (RESOURCE_EXHAUSTED), the learner's and the
coordinator's checkpoint writers and the launcher's supervisor.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """True for an OSError that says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the file system holding ``path`` (its nearest existing parent), or None."""
    current = Path(path).absolute()
    for candidate in (current, *current.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def looks_full(path: str | Path, min_free_bytes: int = 64 << 20) -> bool:
    """True when the file system holding ``path`` has less than ``min_free_bytes`` left:
    for writers whose error on a full disk is not an OSError (``torch.save`` raises a
    RuntimeError "unexpected pos"). 64 MiB, not less: by the time the error is read, other
    processes (and the failed write's own clean-up) may have freed some: under a 1 MiB
    threshold, a 0.5B-shape learner's save that ran out of disk was reported as a bare
    "unexpected pos"."""
    free = free_bytes(path)
    return free is not None and free < min_free_bytes


def describe_write_error(path: str | Path, exc: OSError) -> str:
    """The disk-full message for ENOSPC / EDQUOT, else the error itself."""
    return disk_full_message(exc.filename or path, exc) if is_disk_full(exc) else str(exc)


def disk_full_message(path: str | Path, exc: BaseException | None = None) -> str:
    """``"no space left writing PATH: N MiB free on its file system (<cause>)"``."""
    free = free_bytes(path)
    free_text = "free space unknown" if free is None else f"{free / 2**20:.1f} MiB free"
    why = getattr(exc, "strerror", None) or (str(exc).strip().splitlines() or [""])[-1]
    cause = f" ({why})" if exc is not None else ""
    return f"no space left writing {path}: {free_text} on its file system{cause}"
