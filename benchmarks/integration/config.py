"""Integration suite configuration: one section per component microbenchmark (no torch).

Each microbenchmark compares a hybridflow component with the plain baseline doing the same
work on the same data in the same run: rollout engine vs ``transformers`` ``generate``,
gRPC batch streaming vs raw loopback TCP, planned weight sync vs a raw broadcast, and the
reward service's throughput.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BENCHMARKS = ("rollout", "transfer", "weight_sync", "reward")


@dataclass
class RolloutBench:
    """HFEngine.generate against model.generate on the same prompts and lengths."""

    prompts: int = 16
    """Distinct arithmetic prompts in the batch."""
    n: int = 8
    """Completions per prompt (the batch has prompts * n rows)."""
    max_new_tokens: int = 32
    """Longest completion (both stop early once every row has drawn EOS)."""
    repeats: int = 5
    """Timed batches per engine."""
    warmup: int = 1
    """Untimed batches per engine first."""


@dataclass
class TransferBench:
    """One TrainBatch streamed to a real learner servicer against the same bytes over TCP."""

    num_samples: int = 256
    """Samples in the batch."""
    prompt_tokens: int = 256
    """Prompt length of every sample."""
    response_tokens: int = 768
    """Response length of every sample (one log-prob per token)."""
    chunk_kib: int = 1024
    """Stream chunk size (KiB), as in ChannelConfig.chunk_bytes."""
    repeats: int = 5
    """Timed transfers per transport."""
    warmup: int = 1
    """Untimed transfers per transport first."""


@dataclass
class WeightSyncBench:
    """Planned executor and the naive oracle against a raw gloo broadcast of the same bytes.

    Runs helper code from benchmarks/weight_sync/ (``run_variant``), not a copy of it."""

    model: str = "tiny"
    """Model key of benchmarks/weight_sync/models.py (tiny: the builtin tiny shapes)."""
    num_src: int = 1
    """Learner (FSDP dim-0 source) ranks."""
    tp: int = 1
    """Tensor-parallel size of the one destination replica."""
    bucket_mib: float = 4.0
    """Plan bucket size (MiB)."""
    repeats: int = 10
    """Timed syncs per method."""
    warmup: int = 2
    """Untimed syncs per method first."""
    timeout_s: float = 120.0
    """Limit for each process set to finish."""


@dataclass
class RewardBench:
    """Arithmetic items through a real reward service process."""

    num_items: int = 4096
    """Items scored per repeat (half of them correct)."""
    batch_size: int = 256
    """Items per Score call."""
    repeats: int = 3
    """Timed passes over all items."""
    warmup: int = 1
    """Untimed passes first."""


@dataclass
class IntegrationConfig:
    """The integration suite: component microbenchmarks against plain baselines."""

    suite: str = "integration"
    """Suite name (summary.json)."""
    model: str = "builtin:tiny"
    """Checkpoint the rollout benchmark uses."""
    benchmarks: list[str] = field(default_factory=lambda: list(BENCHMARKS))
    """Which microbenchmarks to run, in order."""
    rollout: RolloutBench = field(default_factory=RolloutBench)
    """Rollout engine vs transformers generate."""
    transfer: TransferBench = field(default_factory=TransferBench)
    """gRPC batch transfer vs raw TCP."""
    weight_sync: WeightSyncBench = field(default_factory=WeightSyncBench)
    """Weight sync vs raw torch.distributed broadcast."""
    reward: RewardBench = field(default_factory=RewardBench)
    """Reward service samples/s."""
    profile: bool = True
    """Record a py-spy flame graph of the whole run (profile.svg)."""
    plots: bool = True
    """Write integration.png."""

    def validate(self) -> None:
        if not self.benchmarks:
            raise ValueError("benchmarks: at least one is required")
        for name in self.benchmarks:
            if name not in BENCHMARKS:
                raise ValueError(f"benchmarks: {name!r} is not one of {BENCHMARKS}")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ValueError(f"benchmarks: duplicates in {self.benchmarks}")
        sections = (
            ("rollout", self.rollout), ("transfer", self.transfer),
            ("weight_sync", self.weight_sync), ("reward", self.reward),
        )  # fmt: skip
        for label, section in sections:
            if section.repeats < 1:
                raise ValueError(f"{label}.repeats must be >= 1, got {section.repeats}")
            if section.warmup < 0:
                raise ValueError(f"{label}.warmup must be >= 0, got {section.warmup}")
        r, t, w, rw = self.rollout, self.transfer, self.weight_sync, self.reward
        for name, value in (
            ("rollout.prompts", r.prompts), ("rollout.n", r.n),
            ("rollout.max_new_tokens", r.max_new_tokens), ("transfer.num_samples", t.num_samples),
            ("transfer.prompt_tokens", t.prompt_tokens),
            ("transfer.response_tokens", t.response_tokens),
            ("reward.num_items", rw.num_items), ("reward.batch_size", rw.batch_size),
        ):  # fmt: skip
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 64 <= t.chunk_kib <= 4096:
            raise ValueError(f"transfer.chunk_kib must be in [64, 4096], got {t.chunk_kib}")
        if w.num_src < 1 or w.tp < 1:
            raise ValueError(
                f"weight_sync.num_src and weight_sync.tp must be >= 1, got {w.num_src}, {w.tp}"
            )
        if w.bucket_mib <= 0 or w.timeout_s <= 0:
            raise ValueError("weight_sync.bucket_mib and weight_sync.timeout_s must be > 0")
