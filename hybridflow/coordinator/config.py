"""Coordinator configuration (imports without torch or grpc)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.ranges import above, at_least, raise_problems, within
from hybridflow.coordinator.pacing import ADMISSION_POLICIES
from hybridflow.coordinator.sinks import LOGGERS
from hybridflow.rpc.config import ChannelConfig, ServerConfig


@dataclass
class SamplingConfig:
    """Sampling of rollouts during training."""

    temperature: float = 1.0
    """Softmax temperature (the learner must use the same for its log-probs)."""
    top_p: float = 1.0
    """Nucleus mass."""
    top_k: int = 0
    """Sample among the k most likely tokens (then top-p within them); 0 is off. The hf
    engine only: the vllm engine refuses top_k > 0, as it refuses top_p < 1."""
    max_new_tokens: int = 8
    """Longest response."""

    def validate(self) -> None:
        raise_problems(
            [
                above("coordinator.sampling.temperature", self.temperature, 0),
                above("coordinator.sampling.top_p", self.top_p, 0)
                or within("coordinator.sampling.top_p", self.top_p, 0, 1),
                at_least("coordinator.sampling.top_k", self.top_k, 0),
                at_least("coordinator.sampling.max_new_tokens", self.max_new_tokens, 1),
            ]
        )
        if self.temperature <= 0:
            raise ValueError("coordinator.sampling.temperature must be > 0 for RL training")
        if not 0 < self.top_p <= 1:
            raise ValueError("coordinator.sampling.top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("coordinator.sampling.top_k must be >= 0 (0: off)")
        if self.max_new_tokens < 1:
            raise ValueError("coordinator.sampling.max_new_tokens must be >= 1")


@dataclass
class CoordinatorConfig:
    """The single controller: data, schedule, addresses of the services."""

    data: str = "builtin:arith"
    """Prompt dataset: builtin:arith, a verl-format .jsonl / .parquet file, or
    sharegpt:PATH (a ShareGPT .json list / .jsonl: the first human turn is the prompt)."""
    data_size: int = 2048
    """Rows to generate for builtin datasets (files use all their rows)."""
    max_prompt_tokens: int = 512
    """Longer prompts are dropped (and counted)."""
    max_prompt_bytes: int = 64 * 1024
    """A dataset row whose prompt is longer than this (UTF-8 bytes of its text) is an error
    naming the row, found before anything is tokenised (preflight and dataset loading)."""
    seed: int = 0
    """Seed of the prompt order (shuffled anew each epoch) and sampling."""
    num_steps: int = 100
    """Learner steps of the run."""
    prompts_per_step: int = 32
    """Distinct prompts per step; the batch is prompts_per_step * group_size samples."""
    group_size: int = 8
    """Completions per prompt (GRPO group)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How rollouts are sampled."""
    prompts_per_request: int = 0
    """Prompts per Generate call (0: prompts_per_step / replicas); smaller keeps replicas
    busier between weight updates."""
    sync_every: int = 1
    """Learner steps between weight publishes to the rollout replicas."""
    max_staleness: int = 0
    """Versions a sample may lag the learner: 0 is synchronous on-policy PPO; k > 0 lets
    rollout run up to k versions ahead of training (asynchronous PPO)."""
    admission: str = "pace"
    """When generation may start, within max_staleness: pace (just in time to keep the
    learner busy, so samples are as fresh as the overlap allows: about 1 version stale when
    generation is faster than training; runs further ahead only when that would keep the
    learner waiting) or greedy (every slot the bound allows: samples max_staleness stale)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a group whose rewards are all equal (zero advantage under a
    group baseline) is not trained; a new prompt takes its place until the batch is full.
    Filtered prompts count as consumed (trained.jsonl marks them "filtered")."""
    dynamic_sampling_max_rounds: int = 10
    """Safety valve: once this many batches' worth of groups were filtered for one step,
    equal groups are trained after all (counted), so a solved task cannot stall the run."""
    rollout_addresses: list[str] = field(default_factory=list)
    """host:port of each rollout replica (deploy/launch.sh fills these in)."""
    reward_address: str = ""
    """host:port of the reward service."""
    learner_address: str = ""
    """host:port of the learner (rank 0)."""
    channel: ChannelConfig = field(default_factory=ChannelConfig)
    """Client settings for every service call."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Control API (status / pause / resume / stop)."""
    save_checkpoint: bool = True
    """Save the final policy as a Hugging Face checkpoint (<run dir>/checkpoints/hf/step_N)."""
    checkpoint_every: int = 50
    """Steps between resumable checkpoints (learner train state + schedule state); one is
    also written on stop / SIGTERM and at the end. 0: only on stop and at the end."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept (older ones are removed)."""
    replica_rejoin_timeout_s: float = 300.0
    """How long a failed rollout replica is waited for (the launcher restarts it) before it
    stays out of the rotation; while no replica serves, the job waits this long."""
    replica_stall_timeout_s: float = 20.0
    """A rollout replica that holds a request and shows no sign of life for this long has
    failed: no answer to a liveness probe (a status call, probed every quarter of this), or
    answers while its engine makes no progress (``engine_steps`` still; ``liveness.py``). Its
    prompts go to the others and it rejoins after a weight refit. A live replica answers in
    milliseconds and steps many times a second even while it generates, so this bounds host
    hiccups (GC, swap, an oversubscribed CPU) and the longest single engine step or weight
    apply, not generation length. 0: never probed (only the call's deadline,
    coordinator.channel.timeout_s)."""
    service_wait_s: float = 120.0
    """How long an unreachable reward service is retried (it may be restarting)."""
    progress: bool = True
    """Show a progress bar with live reward."""
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where step metrics go, with the same names and the global step: jsonl
    (<run dir>/metrics.jsonl, always written, listed or not), tensorboard
    (<run dir>/tensorboard/), wandb (honours WANDB_MODE=offline, WANDB_PROJECT), mlflow
    (MLFLOW_TRACKING_URI). wandb and mlflow must be installed when listed."""

    def validate(self) -> None:
        raise_problems(
            [
                *(
                    at_least(f"coordinator.{name}", getattr(self, name), 1)
                    for name in (
                        "data_size",
                        "max_prompt_tokens",
                        "max_prompt_bytes",
                        "num_steps",
                        "prompts_per_step",
                        "group_size",
                        "sync_every",
                        "dynamic_sampling_max_rounds",
                    )
                ),
                at_least("coordinator.seed", self.seed, 0),
                at_least("coordinator.prompts_per_request", self.prompts_per_request, 0),
                at_least("coordinator.max_staleness", self.max_staleness, 0),
                None
                if self.admission in ADMISSION_POLICIES
                else f"coordinator.admission: must be one of {', '.join(ADMISSION_POLICIES)}, "
                f"got {self.admission!r}",
                *(
                    f"coordinator.loggers: unknown logger {name!r}; known: {', '.join(LOGGERS)}"
                    for name in self.loggers
                    if name not in LOGGERS
                ),
                "coordinator.dynamic_sampling: needs coordinator.group_size >= 2 (a group of "
                "one always has equal rewards)"
                if self.dynamic_sampling and self.group_size < 2
                else None,
            ]
        )
        for name in ("data_size", "num_steps", "prompts_per_step", "group_size", "sync_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"coordinator.{name} must be >= 1")
        if self.max_staleness < 0:
            raise ValueError("coordinator.max_staleness must be >= 0")
        if self.prompts_per_request < 0:
            raise ValueError("coordinator.prompts_per_request must be >= 0")
        if self.checkpoint_every < 0:
            raise ValueError("coordinator.checkpoint_every must be >= 0")
        if self.keep_checkpoints < 1:
            raise ValueError("coordinator.keep_checkpoints must be >= 1")
        for name in ("replica_rejoin_timeout_s", "replica_stall_timeout_s", "service_wait_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"coordinator.{name} must be >= 0")
