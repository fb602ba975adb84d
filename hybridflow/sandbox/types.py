"""The sandbox's interface: what a program may use, what came of running it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

Outcome = Literal["ok", "exit", "timeout", "cpu", "memory", "output", "error"]
"""``ok``: exit code 0; ``exit``: another exit code or a signal of its own; ``timeout``: the
wall-time limit; ``cpu``: the CPU-seconds limit; ``memory``: the address-space limit (a
``MemoryError`` or an allocation the kernel refused); ``output``: more than
``output_bytes``; ``error``: the sandbox itself could not run it."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use; past any limit it is stopped."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 1024 * 1024
    processes: int = 32
    """Processes and threads of the sandbox's user at once (a fork bomb stops here)."""
    open_files: int = 64
    output_bytes: int = 1024 * 1024
    """Of stdout and of stderr each; the program is stopped when either passes it."""
    file_bytes: int = 16 * 1024 * 1024
    """Largest file it may write in its scratch directory."""


@dataclass(frozen=True)
class SandboxResult:
    """One run: the outcome, its exit code (-N: killed by signal N; None: never started),
    its output (cut at the limit) and wall time."""

    outcome: Outcome
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    reason: str = ""
    """One line on why it did not end ``ok``."""


class SandboxUnavailable(RuntimeError):
    """The isolation tool is missing or does not work here: nothing was run."""


class Sandbox(Protocol):
    """Runs one program, isolated: no network, a read-only system, a private scratch
    directory holding ``files``, its own PID namespace, under ``limits``; nothing of the
    caller's files, environment or processes visible."""

    def run(
        self,
        argv: list[str],
        files: Mapping[str, str | bytes],
        limits: SandboxLimits,
        stdin: bytes = b"",
    ) -> SandboxResult: ...
