"""POSIX shared memory and named semaphores a service's process tree creates, released on its
way out, whenever that is (engine start included).

vLLM's engine allocates ``/dev/shm/psm_*`` segments (the executor's broadcast queue is
160 MB; each worker has its own reply queue) and multiprocessing semaphores
(``/dev/shm/sem.mp-*``) through ``multiprocessing``, which registers each with its resource
tracker, a helper process that unlinks what is left once every process using it has
exited. Two ways that goes wrong: a SIGTERM before any handler is installed ends the
process without running a finaliser, and the launcher's SIGKILL of the service's process
group, sent right after the service exits, also kills the tracker before it has cleaned up.

``IpcLedger.install()`` records what this process registers; ``release()`` then (1) ends
the multiprocessing children still running (vLLM's workers, whose own segments are tracked
by the same tracker), (2) unlinks what this process created and still holds, and (3) stops
the resource tracker and waits for it, so whatever the children left is gone before this
process exits. Every step is bounded. Knows nothing of vLLM, gRPC or torch.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
import threading
from collections.abc import Callable
from multiprocessing import resource_tracker
from typing import Any

log = logging.getLogger(__name__)


class IpcLedger:
    """Names of the shared-memory segments and semaphores this process registered with
    multiprocessing's resource tracker and has not released yet."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        """name → resource type ("shared_memory" or "semaphore")."""
        self._lock = threading.Lock()
        self._register: Callable[[str, str], None] = resource_tracker.register
        self._unregister: Callable[[str, str], None] = resource_tracker.unregister

    @classmethod
    def install(cls) -> IpcLedger:
        """Starts recording (call before anything allocates: before the engine is built)."""
        ledger = cls()
        resource_tracker.register = ledger._on_register  # type: ignore[assignment]
        resource_tracker.unregister = ledger._on_unregister  # type: ignore[assignment]
        return ledger

    def _on_register(self, name: str, rtype: str) -> None:
        with self._lock:
            self.names[name] = rtype
        self._register(name, rtype)

    def _on_unregister(self, name: str, rtype: str) -> None:
        with self._lock:
            self.names.pop(name, None)
        self._unregister(name, rtype)

    def release(self, grace_s: float = 10.0) -> list[str]:
        """Children ended, own names unlinked, the tracker stopped; returns what this process
        unlinked itself (each one a leak prevented)."""
        _end_children(grace_s)
        with self._lock:
            left = dict(self.names)
        released: set[str] = set()
        previous = sys.unraisablehook

        def quiet(args: Any) -> None:  # an owner's finaliser may run from here on
            if not _second_unlink(args, released):
                previous(args)

        sys.unraisablehook = quiet
        unlinked = []
        for name, rtype in left.items():
            released.add(name.lstrip("/"))  # before the unlink: a finaliser may run at once
            if _unlink(name, rtype):
                unlinked.append(name)
        _cancel_semaphore_finalisers({n for n in unlinked if left[n] == "semaphore"})
        for name, rtype in left.items():
            self._on_unregister(name, rtype)
        _stop_tracker(grace_s)
        if unlinked:
            log.info("released %d shared-memory objects left by the engine", len(unlinked))
        return unlinked


def _second_unlink(args: Any, released: set[str]) -> bool:
    """Whether an "Exception ignored" at exit is a segment owner's finaliser unlinking, a
    second time, what ``release`` already unlinked: noise, not a fault."""
    exc = args.exc_value
    return isinstance(exc, FileNotFoundError) and (exc.filename or "").lstrip("/") in released


def _cancel_semaphore_finalisers(names: set[str]) -> None:
    """multiprocessing unlinks a semaphore from a finaliser when its owner is collected or
    the process exits; for one ``release`` unlinked, that second unlink only prints a
    traceback, so it is cancelled."""
    from multiprocessing import util

    registry: dict[Any, Any] = getattr(util, "_finalizer_registry", {})
    for finaliser in list(registry.values()):
        callback = getattr(finaliser, "_callback", None)
        args = getattr(finaliser, "_args", None) or ()
        if getattr(callback, "__name__", "") == "_cleanup" and args and args[0] in names:
            finaliser.cancel()


def _end_children(grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``, to multiprocessing children still running."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(grace_s)
        if child.is_alive():
            log.warning("%s (pid %s) ignored SIGTERM; killing it", child.name, child.pid)
            child.kill()
            child.join(grace_s)


def _unlink(name: str, rtype: str) -> bool:
    """Unlinks one POSIX object by name; False if it was already gone."""
    try:
        if rtype == "shared_memory":
            import _posixshmem  # type: ignore[import-not-found]

            _posixshmem.shm_unlink(name)
        elif rtype == "semaphore":
            import _multiprocessing

            _multiprocessing.sem_unlink(name)  # type: ignore[attr-defined]
        else:
            return False
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("could not unlink %s %s: %s", rtype, name, exc)
        return False
    return True


def _stop_tracker(grace_s: float) -> None:
    """Closes this process's end of the resource tracker's pipe and waits (bounded) for the
    tracker to unlink what the children left and exit."""
    tracker: Any = resource_tracker._resource_tracker
    if getattr(tracker, "_fd", None) is None:
        return  # never started here
    stopper = threading.Thread(target=tracker._stop, name="resource-tracker-stop", daemon=True)
    stopper.start()
    stopper.join(grace_s)
    if stopper.is_alive():
        log.warning("multiprocessing's resource tracker did not exit within %.0fs", grace_s)
