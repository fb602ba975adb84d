"""Settings of the scalability suite's simulated-scale section (no torch, no grpc).

The variants themselves are a plain ``BenchmarkConfig`` (benchmarks/scalability/config.yaml);
these settings come from run_benchmark.py's command line, since the shared runner loads the
YAML strictly as a ``BenchmarkConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimulatedConfig:
    """Coordinator dispatch overhead with many instant replicas, and the planner's cost."""

    enabled: bool = True
    """Run the simulated section after the variants."""
    replicas: list[int] = field(default_factory=lambda: [64, 128, 256, 512])
    """Numbers of instant fake rollout replicas to drive."""
    prompts_per_step: int = 512
    """Prompts per step (same for every replica count: the work is fixed, replicas vary)."""
    group_size: int = 8
    """Completions per prompt."""
    response_tokens: int = 16
    """Tokens in each fake completion."""
    prompt_tokens: int = 8
    """Tokens in each fake prompt."""
    num_steps: int = 6
    """Steps per replica count (the first ``warmup_steps`` are not timed)."""
    warmup_steps: int = 1
    """Untimed steps (thread start-up)."""
    max_staleness: int = 1
    """Staleness bound of the simulated job (1: replicas run one step ahead)."""
    plan_layers: int = 80
    """Decoder layers of the 70B-class topology given to the planner."""
    plan_num_src: int = 64
    """FSDP learner ranks of the planned topology."""
    plan_tp: int = 8
    """Tensor-parallel size of each planned replica."""
    plan_replicas: int = 8
    """Planned replicas."""
    plan_bucket_mib: float = 256.0
    """Planned bucket size (MiB)."""

    def validate(self) -> None:
        if not self.replicas or any(r < 1 for r in self.replicas):
            raise ValueError(
                f"simulated.replicas must be a non-empty list of ints >= 1: {self.replicas}"
            )
        for name in (
            "prompts_per_step", "group_size", "response_tokens", "prompt_tokens", "num_steps",
            "plan_layers", "plan_num_src", "plan_tp", "plan_replicas",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"simulated.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.num_steps:
            raise ValueError(
                f"simulated.warmup_steps must be in [0, num_steps={self.num_steps}), "
                f"got {self.warmup_steps}"
            )
        if self.max_staleness < 0:
            raise ValueError(f"simulated.max_staleness must be >= 0, got {self.max_staleness}")
        if self.plan_bucket_mib <= 0:
            raise ValueError(f"simulated.plan_bucket_mib must be > 0, got {self.plan_bucket_mib}")
