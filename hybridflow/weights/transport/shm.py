"""POSIX shared-memory segments for same-host weight transfers, and this host's identity.

A segment is a file under ``/dev/shm`` (what ``shm_open`` uses on Linux) created with
``O_CREAT | O_EXCL`` and mode 0600, mapped ``MAP_SHARED`` and seen as a flat ``uint8`` tensor.
Its name carries the creator's pid (``hfws-<pid>-<group>-d<dst>-b<buffer>``): the creator
unlinks the name as soon as its peers have mapped it (the memory then lives only as long as the
mappings, so a crash leaves nothing behind), and ``remove_stale_segments`` unlinks names whose
creator died in the short window between creating and unlinking.

``/dev/shm`` is a tmpfs, often small (64 MiB in a default Docker container): a write to a page
it cannot supply kills the writer with SIGBUS. So the creator ``reserve``s a segment's pages
(``posix_fallocate``) before any peer writes to it, and a segment that does not fit fails
there, with an ``OSError``, instead of in the middle of a sync.

This module knows files, mappings and hosts; it does not know plans, groups or buckets.
"""

from __future__ import annotations

import mmap
import os
import re
import socket
from pathlib import Path

import torch

SHM_DIR = Path("/dev/shm")
PREFIX = "hfws-"
_NAME = re.compile(r"hfws-(\d+)-")
ALIGN_BYTES = 64


def host_identity() -> str:
    """Hostname and kernel boot id: equal on two processes that can share ``/dev/shm``
    (a match is only a candidate; the peer still has to open the segment)."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "no-boot-id"
    return f"{socket.gethostname()}/{boot_id}"


def segment_name(group_name: str, dst: int, buffer: int) -> str:
    """The name of one staging buffer a destination rank creates in one group."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", group_name)
    return f"{PREFIX}{os.getpid()}-{safe}-d{dst}-b{buffer}"


class Segment:
    """One mapped shared-memory segment; ``tensor`` is its bytes as a ``uint8`` tensor."""

    def __init__(self, name: str, num_bytes: int, create: bool, directory: Path = SHM_DIR) -> None:
        self.name = name
        self.path = directory / name
        self.num_bytes = num_bytes
        self._owner = create
        self._reserved = False
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.fchmod(fd, 0o600)  # whatever the umask
                os.ftruncate(fd, num_bytes)
            elif os.fstat(fd).st_size != num_bytes:
                raise ValueError(
                    f"shared memory {name}: {os.fstat(fd).st_size} bytes, expected {num_bytes}"
                )
            self._map: mmap.mmap | None = mmap.mmap(fd, num_bytes, mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            if create:
                self.path.unlink(missing_ok=True)
            raise
        self._fd: int | None = fd if create else None  # the creator may still reserve
        if not create:
            os.close(fd)
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)

    @property
    def reserved(self) -> bool:
        """Whether every page is allocated (``reserve()`` with no argument succeeded)."""
        return self._reserved

    def reserve(self, num_bytes: int | None = None) -> None:
        """Allocate the first ``num_bytes`` (default: all) now, creator only: ``OSError``
        (ENOSPC) if ``/dev/shm`` cannot hold them, where a later write would die of SIGBUS."""
        if self._reserved:
            return
        if self._fd is None:
            raise ValueError(f"shared memory {self.name}: only its creator reserves it")
        os.posix_fallocate(self._fd, 0, self.num_bytes if num_bytes is None else num_bytes)
        self._reserved = num_bytes is None or num_bytes >= self.num_bytes

    def unlink(self) -> None:
        """Remove the name (creator only); the mappings stay valid."""
        if self._owner:
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Unlink (creator) and drop this object's mapping. Tensor views handed out earlier
        stay valid: the mapping is unmapped when the last of them is freed."""
        self.unlink()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._map is not None:
            # No mmap.close(): it would unmap under live views (torch.frombuffer does not pin
            # the buffer). Each view's storage holds a reference to the mmap object, which
            # unmaps when the last of them is freed.
            del self.tensor
            self._map = None


def remove_stale_segments(directory: Path = SHM_DIR) -> list[str]:
    """Unlink this user's segments whose creating process no longer exists; their names."""
    removed = []
    uid = os.getuid()
    for path in directory.glob(f"{PREFIX}*"):
        match = _NAME.match(path.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            if path.stat().st_uid != uid:
                continue
            path.unlink()
        except FileNotFoundError:  # another rank cleaned it first
            continue
        removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def aligned(num_bytes: int) -> int:
    """``num_bytes`` rounded up so every tensor of a segment starts 64-byte aligned."""
    return -(-num_bytes // ALIGN_BYTES) * ALIGN_BYTES
