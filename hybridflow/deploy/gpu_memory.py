"""Peak GPU memory per process, sampled with nvidia-smi while a job runs.

On a machine without nvidia-smi the sampler does nothing and reports nothing. It knows
process ids, not services: the launcher maps pids to services.
"""

from __future__ import annotations

import shutil
import subprocess
import threading


def parse_compute_apps(text: str) -> dict[int, int]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``
    output → {pid: bytes}; a process on several GPUs is summed."""
    usage: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        pid, mib = int(parts[0]), int(parts[1])
        usage[pid] = usage.get(pid, 0) + mib * 1024 * 1024
    return usage


class GpuMemorySampler:
    """Polls nvidia-smi every ``interval_s`` and keeps each pid's peak."""

    def __init__(self, interval_s: float = 1.0, command: str = "nvidia-smi") -> None:
        self._binary = shutil.which(command)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_bytes: dict[int, int] = {}

    @property
    def available(self) -> bool:
        return self._binary is not None

    def sample(self) -> None:
        if self._binary is None:
            return
        try:
            out = subprocess.run(
                [
                    self._binary,
                    "--query-compute-apps=pid,used_memory",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
        for pid, used in parse_compute_apps(out).items():
            self.peak_bytes[pid] = max(used, self.peak_bytes.get(pid, 0))

    def start(self) -> None:
        if self._binary is None or self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(self._interval_s):
                self.sample()

        self._thread = threading.Thread(target=loop, name="gpu-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None
