"""Settings of a sandbox pool and of each program it runs: ``reward.sandbox`` (the code scorer)
and ``environment.sandbox`` (the ``python`` tool). Imports without torch or grpc."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems
from hybridflow.sandbox.types import SandboxLimits

BACKENDS = ("bubblewrap",)
"""Isolation tools a pool can run on (``hybridflow/sandbox/<backend>.py``)."""


@dataclass
class SandboxConfig:
    """One service's sandbox pool: how many programs run at once, how many may wait, and
    what each program may use before it is stopped."""

    backend: str = knob("bubblewrap", choices=BACKENDS)
    """The isolation tool: bubblewrap (Debian's ``bubblewrap``; a machine without it is
    refused, nothing runs unsandboxed)."""
    workers: int = knob(2, ge=1, le=256)
    """Programs run at once (the pool's slots). A program uses one core while it computes;
    beyond the cores it costs latency, not throughput."""
    max_queued: int = knob(4096, ge=0)
    """Programs that may wait for a slot; one more is refused (the item fails, named)."""
    wall_s: float = knob(5.0, gt=0, le=600)
    """Wall time of one run (the program and all its tests); past it the run is killed."""
    cpu_s: int = knob(2, ge=1, le=600)
    """CPU seconds of each process of a run (killed at the limit)."""
    memory_mb: int = knob(512, ge=16, le=1024 * 1024)
    """Address space of each process of a run (MiB)."""
    processes: int = knob(32, ge=1, le=4096)
    """Processes and threads a run may have at once (a fork bomb stops here)."""
    open_files: int = knob(64, ge=16, le=65536)
    """Open files of each process of a run."""
    output_kb: int = knob(64, ge=1, le=1024 * 1024)
    """Stdout and stderr of a run, each (KiB); a run that writes more is stopped."""
    file_kb: int = knob(16 * 1024, ge=1, le=1024 * 1024)
    """Largest file a run may write in its scratch directory (KiB)."""

    def limits(self) -> SandboxLimits:
        """The limits of one run."""
        return SandboxLimits(
            wall_s=self.wall_s,
            cpu_s=self.cpu_s,
            memory_bytes=self.memory_mb * 1024 * 1024,
            processes=self.processes,
            open_files=self.open_files,
            output_bytes=self.output_kb * 1024,
            file_bytes=self.file_kb * 1024,
        )

    def validate(self, key: str = "sandbox") -> None:
        """Raise ValueError naming every field out of its bound."""
        raise_problems(list(field_problems(self, key)))
