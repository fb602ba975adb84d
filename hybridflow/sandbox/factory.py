"""The pool a service's ``SandboxConfig`` names, on its backend."""

from __future__ import annotations

from hybridflow.sandbox.config import SandboxConfig
from hybridflow.sandbox.pool import SandboxPool, slot_uid


def pool_from_config(config: SandboxConfig) -> SandboxPool:
    """A started pool on ``config.backend``; ``SandboxUnavailable`` when the backend cannot
    isolate here (nothing then runs)."""
    config.validate()
    if config.backend == "bubblewrap":
        from hybridflow.sandbox.bubblewrap import BubblewrapSandbox

        return SandboxPool(
            lambda slot: BubblewrapSandbox(uid=slot_uid(slot)), config.workers, config.max_queued
        )
    raise ValueError(f"sandbox.backend {config.backend!r}: not a backend")
