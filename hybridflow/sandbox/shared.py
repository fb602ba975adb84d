"""This process's sandbox pool for code that cannot be handed one: environments, which the
runner makes per episode from a class with no arguments (the ``python`` tool). The
environment service's main ``configure``s it from ``environment.sandbox`` when it starts and
``close``s it when it stops; elsewhere (the in-process runner) it is made on first use with
``SandboxConfig``'s defaults. Thread-safe."""

from __future__ import annotations

import threading

from hybridflow.sandbox.config import SandboxConfig
from hybridflow.sandbox.factory import pool_from_config
from hybridflow.sandbox.pool import SandboxPool

_lock = threading.Lock()
_config = SandboxConfig()
_pool: SandboxPool | None = None


def configure(config: SandboxConfig) -> None:
    """The settings the pool is made with (before its first use; a pool already made is
    closed, and the next use makes a new one)."""
    global _config
    config.validate()
    with _lock:
        _config = config
    close()


def shared_pool() -> SandboxPool:
    """The pool, made on first use (``SandboxUnavailable`` where nothing can be sandboxed)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = pool_from_config(_config)
        return _pool


def limits_config() -> SandboxConfig:
    """The settings in force (each run's limits: ``.limits()``)."""
    with _lock:
        return _config


def close() -> None:
    """Stops the pool if one was made (programs running end by their deadlines)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()
