"""Keep freed memory in the process instead of handing it back to the kernel (glibc's malloc).

A train step allocates the same large tensors again and again: every micro-batch's backward
writes a fresh gradient for each weight (the 0.5B shape: 1.9 GB of them, the tied embedding's
545 MB alone), the optimizer its temporaries. glibc serves each allocation over 32 MB with
its own ``mmap`` and ``munmap``s it on free, so every micro-batch touches gigabytes of new
pages: the 0.5B-shape learner step took 8.4 million page faults and 30 of its 71 seconds in
the kernel on these machines (a virtual machine whose freed pages go back to the host: a fault
costs tens of microseconds). With ``mmap`` off for the heap and no trimming, freed blocks stay
in the heap and the next micro-batch reuses them: the same step after two warm steps takes no
fault and 31 s at 2 threads, against 95 s (``benchmarks/LOG.md``, 2026-12-06). One arena for
every thread: glibc gives each new thread an arena of its own, built of 64 MB heaps, where a
larger block is ``mmap``ped whatever ``M_MMAP_MAX`` says; a service's train step runs in a
gRPC worker thread, so without it the setting reached the main thread only (and each
thread's arena kept its own freed blocks).

Set it before the process starts a thread (``deploy/launch.sh``'s lifeline watchdog, gRPC's
workers, torch's pools): a thread's first ``malloc`` gives it an arena of its own while the
limit is unset, and glibc later hands such an arena to other new threads too. The launched
services once called it after their lifeline thread had started: a learner's step in a job
then took 55 s, faulting 50,000 pages a second with half its CPU in the kernel, against 31 s
for the same samples without that thread (``benchmarks/LOG.md``, 2026-12-06). A call that
comes after another thread logs a warning naming them.

What it costs: memory a process freed is not returned to the system until it exits, so its
resident size stays at its peak (which a learner or an engine reaches every step anyway).
Several ranks on one host (torchrun's ``LOCAL_WORLD_SIZE`` over 1) keep glibc's defaults
unless ``HYBRIDFLOW_MALLOC=keep``: each would hold its own peak, and the 0.5B-shape config's
two FSDP ranks beside a vLLM replica reached 10 GB each at their first step and the kernel
killed one on a 23 GB machine (``benchmarks/LOG.md``, 2026-12-07); with the defaults they
fit, at 51 s a step.

A process started afresh (``spawn``, ``exec``) does not inherit ``mallopt``'s settings, which
live in its parent's memory: vLLM's CPU workers are spawned, and each weight sync's reload
allocates about 2 GB there at the 0.5B shape. With the setting a sync took 1.4-1.7 s against
3.6 s, but the worker then holds its peak beside the learner's: in the 0.5B-shape async vLLM
job the machine's available memory fell from 2.6 GB to 0.4 GB of 23 GB (``benchmarks/LOG.md``,
2026-12-08). So, like several ranks on one host, such processes keep glibc's defaults unless
``HYBRIDFLOW_MALLOC=keep`` asks for it; ``child_tunables`` then gives the setting as
``GLIBC_TUNABLES``, which glibc reads before the child's first ``malloc``.

The services that run torch compute call ``keep_freed_memory`` first thing in ``main``
(``hybridflow.main.bootstrap.setup_torch_process`` calls it too, for other callers). ``HYBRIDFLOW_MALLOC=keep`` or
``system`` decides for every service instead. Elsewhere than glibc (macOS, musl) nothing
changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

ENV = "HYBRIDFLOW_MALLOC"
"""``keep``: ``keep_freed_memory`` applies; unset: it applies unless several ranks share the
host; ``system``: the C allocator is left as it is."""

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
M_ARENA_MAX = -8
"""``mallopt`` parameters (glibc's ``malloc.h``)."""

TOP_PAD_BYTES = 256 << 20
"""How much more than asked the heap grows by at a time (fewer, larger ``brk`` calls)."""

_applied = False


def keep_freed_memory() -> bool:
    """Tunes glibc's malloc for a process that reuses large tensors: no ``mmap`` per
    large block, no trimming, one arena, unless ``HYBRIDFLOW_MALLOC=system`` (or, unset,
    several torchrun ranks share this host: module doc). True if applied
    (now or before); False where not asked, or where the C library is not glibc. Safe to call
    more than once."""
    global _applied
    if _applied:
        return True
    choice = os.environ.get(ENV, "").strip().lower()
    if choice not in ("", "keep", "system"):
        raise ValueError(f"{ENV}={choice!r}: expected 'keep' or 'system' (or unset)")
    if choice == "system" or (choice == "" and _ranks_on_this_host() > 1):
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    # Trim threshold -1 is SIZE_MAX for glibc: the heap's top is never given back. One
    # arena: glibc gives other threads arenas of their own, built of 64 MB heaps, and a block
    # larger than that is mmapped there whatever M_MMAP_MAX says; a service's train step runs
    # in a gRPC worker thread, so without it the setting reached only the main thread's blocks.
    results = [
        mallopt(M_MMAP_MAX, 0),
        mallopt(M_TRIM_THRESHOLD, -1),
        mallopt(M_TOP_PAD, TOP_PAD_BYTES),
        mallopt(M_ARENA_MAX, 1),
    ]
    if not all(results):
        log.warning("mallopt refused a setting (%s); the allocator keeps its defaults", results)
        return False
    _applied = True
    early = other_threads()
    if early:
        log.warning(
            "the allocator was set after other threads started (%s): threads that allocated "
            "before may keep arenas of their own, whose large blocks are mmapped and unmapped "
            "every time; call keep_freed_memory before starting any thread",
            ", ".join(early),
        )
    return True


TUNABLES_ENV = "GLIBC_TUNABLES"
TUNABLES = (
    ("glibc.malloc.mmap_max", 0),
    ("glibc.malloc.trim_threshold", 1 << 62),
    ("glibc.malloc.top_pad", TOP_PAD_BYTES),
    ("glibc.malloc.arena_max", 1),
)
"""``keep_freed_memory``'s four settings as glibc's tunables (the trim threshold: never, in
practice; ``mallopt``'s -1 has no spelling there)."""


def child_tunables(current: str | None = None) -> str | None:
    """The ``GLIBC_TUNABLES`` value that gives a process started afresh this process's
    setting (module doc): ``current`` (the environment's value, by default) with
    ``TUNABLES`` added where it does not name them already (a key the user set wins).
    None unless ``HYBRIDFLOW_MALLOC=keep`` asked for it and it applied here."""
    if not _applied or os.environ.get(ENV, "").strip().lower() != "keep":
        return None
    if current is None:
        current = os.environ.get(TUNABLES_ENV, "")
    items = [item for item in current.split(":") if item]
    named = {item.split("=", 1)[0] for item in items}
    items += [f"{key}={value}" for key, value in TUNABLES if key not in named]
    return ":".join(items)


PROBE_BYTES = 64 << 20
"""Over glibc's largest dynamic mmap threshold (32 MB): glibc as it comes maps such a block."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def keeps_large_blocks() -> bool | None:
    """Whether this process's allocator serves a large block from its heap (the setting holds,
    from ``mallopt`` or from the tunables it started with) rather than mapping it; None where
    the C library is not glibc (2.33+). Allocates and frees ``PROBE_BYTES``, untouched."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(PROBE_BYTES)
    if not block:
        return None
    try:
        return bool(libc.mallinfo2().hblkhd - before < PROBE_BYTES)
    finally:
        libc.free(block)


def _ranks_on_this_host() -> int:
    """torchrun's ``LOCAL_WORLD_SIZE`` (1 outside torchrun)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def other_threads() -> list[str]:
    """The names (``comm``) of this process's threads other than the calling one, native
    ones included (``/proc/self/task``); empty where ``/proc`` is not there."""
    me = threading.get_native_id()
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    for task in tasks:
        if task == str(me):
            continue
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:
            continue  # ended meanwhile
    return names


def _glibc() -> ctypes.CDLL | None:
    """The C library, or None where it is not glibc."""
    if not hasattr(os, "confstr"):
        return None
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return None
    if not version or not version.startswith("glibc"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is another one."""
    libc = _glibc()
    if libc is None:
        return None
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt  # type: ignore[no-any-return]
