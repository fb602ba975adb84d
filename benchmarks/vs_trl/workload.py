"""The workloads both sides of ``run_benchmark.py`` run (issue 45's 0.5B shape, and the
quickstart's), and the process facts both report the same way (start time, peak memory)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workload:
    model: str = "builtin:qwen2.5-0.5b-shape"
    """Qwen2.5-0.5B's dimensions (494M parameters, vocabulary 151,936), random init, fp32."""
    data: str = "builtin:arith"
    data_size: int = 512
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 4
    temperature: float = 1.0
    lr: float = 1.0e-6
    grad_clip: float = 1.0
    micro_batch_size: int = 8
    """Completions a forward/backward (TRL's default ``per_device_train_batch_size``)."""
    job: str = "benchmarks/vs_trl/job.yaml"
    """hybridflow's job config holding the same numbers (the runner adds each variant's
    engine, threads and staleness)."""
    job_overrides: tuple[str, ...] = ()
    """Overrides of ``job`` every hybridflow variant runs with."""

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


WORKLOADS = {
    "0.5b": Workload(),
    "quickstart": Workload(
        model="builtin:tiny",
        data="builtin:arith:train",
        data_size=2048,
        prompts_per_step=32,
        lr=2.0e-4,
        micro_batch_size=64,
        job="deploy/configs/quickstart.yaml",
        # TRL does not evaluate: neither side does while timed
        job_overrides=("coordinator.eval.sets=[]",),
    ),
}
"""``--workload`` choices: the 0.5B shape (issue 45's table) and the quickstart's job (the
built-in tiny model, 32 prompts x 8 completions of 4 tokens), where start-up dominates."""
WORKLOAD = WORKLOADS["0.5b"]


def peak_rss_bytes() -> int:
    """This process's peak resident set (Linux's VmHWM; 0 elsewhere)."""
    status = Path("/proc/self/status")
    if not status.exists():
        return 0
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def process_start_time(fallback: float) -> float:
    """When this process started (epoch seconds, from /proc: before the interpreter's own
    start-up), or ``fallback`` where /proc cannot say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return fallback
    return boot + started_ticks / os.sysconf("SC_CLK_TCK")
