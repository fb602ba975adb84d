"""Coordinator configuration (imports without torch or grpc)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems
from hybridflow.coordinator.eval_config import EvalConfig
from hybridflow.coordinator.pacing import AdmissionPolicy
from hybridflow.coordinator.sinks import LOGGERS
from hybridflow.rpc.config import ChannelConfig, ServerConfig


@dataclass
class SamplingConfig:
    """Sampling of rollouts during training."""

    temperature: float = knob(1.0, gt=0)
    """Softmax temperature (the learner must use the same for its log-probs)."""
    top_p: float = knob(1.0, gt=0, le=1)
    """Nucleus mass."""
    top_k: int = knob(0, ge=0)
    """Sample among the k most likely tokens (then top-p within them); 0 is off. The hf
    engine only: the vllm engine refuses top_k > 0, as it refuses top_p < 1."""
    max_new_tokens: int = knob(8, ge=1)
    """Longest response."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "coordinator.sampling"))


@dataclass
class MultiTurnConfig:
    """Multi-turn episodes with an environment (docs/environments.md); an empty ``env``
    keeps every rollout one prompt and one response."""

    env: str = knob("", free="an import path, checked when the environment loads")
    """The environment class, ``module:Class`` or ``file.py:Class`` (reset / step)."""
    agent: str = knob("", free="an import path, checked when the environment service loads it")
    """Instead of ``env``: an agent, any callable ``module:function`` of (task, OpenAI
    client) that runs its own loop against its episode's OpenAI-compatible endpoint and
    returns its reward (docs/agents.md); runs in the environment service (list it in
    environment.envs), its trajectories captured token-exact."""
    max_turns: int = knob(4, ge=1)
    """Policy turns per episode at most."""
    max_total_tokens: int = knob(256, ge=2)
    """Response tokens per trajectory (the policy's and the observations') at most; a turn
    that would pass it is cut to fit, an observation that would is not appended."""
    env_concurrency: int = knob(8, ge=1, le=256)
    """Environment steps one request runs at once (its episodes' answers to one turn), so
    slow ones (tool calls run in the sandbox) take the longest one's time, not the sum."""

    @property
    def enabled(self) -> bool:
        return bool(self.env or self.agent)

    @property
    def path(self) -> str:
        """The environment class's or the agent's import path (whichever is set)."""
        return self.env or self.agent


@dataclass
class CoordinatorConfig:
    """The single controller: data, schedule, addresses of the services."""

    data: str = knob("builtin:arith", free="a dataset name or path, checked when it loads")
    """Prompt dataset: builtin:arith (single-turn; builtin:arith:train leaves out the held-out
    problems of builtin:arith:test), builtin:calc or builtin:guess (multi-turn
    tasks for the built-in environments), a verl-format .jsonl / .parquet file, or
    sharegpt:PATH (a ShareGPT .json list / .jsonl: the first human turn is the prompt)."""
    data_size: int = knob(2048, ge=1)
    """Rows to generate for builtin datasets (files use all their rows)."""
    max_prompt_tokens: int = knob(512, ge=1)
    """Longer prompts are dropped (and counted)."""
    max_prompt_bytes: int = knob(64 * 1024, ge=1)
    """A dataset row whose prompt is longer than this (UTF-8 bytes of its text) is an error
    naming the row, found before anything is tokenised (preflight and dataset loading)."""
    seed: int = knob(0, ge=0)
    """Seed of the prompt order (shuffled anew each epoch) and sampling."""
    num_steps: int = knob(100, ge=1)
    """Learner steps of the run."""
    prompts_per_step: int = knob(32, ge=1)
    """Distinct prompts per step; the batch is prompts_per_step * group_size samples."""
    group_size: int = knob(8, ge=1)
    """Completions per prompt (GRPO group)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How rollouts are sampled."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Episodes of several turns against an environment (off unless ``env`` is set);
    ``sampling.max_new_tokens`` bounds each turn."""
    prompts_per_request: int = knob(0, ge=0)
    """Prompts per Generate call (0: prompts_per_step / replicas); smaller keeps replicas
    busier between weight updates."""
    sync_every: int = knob(1, ge=1)
    """Learner steps between weight publishes to the rollout replicas."""
    max_staleness: int = knob(0, ge=0)
    """Versions a sample may lag the learner: 0 is synchronous on-policy PPO; k > 0 lets
    rollout run up to k versions ahead of training (asynchronous PPO)."""
    overlap_publish: bool = True
    """Asynchronous runs (max_staleness >= 1 version per step): each weight publish runs
    beside the next train step (the learner sends a snapshot of its shards from a background
    thread; a replica counts as holding the new version only once the publish finished).
    Costs the learner one copy of its parameter shards while a publish is on the wire.
    false: every publish ends before the next step starts. Synchronous runs always publish
    before the next generation."""
    train_ahead: bool = True
    """With overlap_publish, in asynchronous runs over a learner service: the next step is
    sent to the learner while the current one trains, if the buffer already holds its
    batch, and each step starts its own publish as it ends (no StartPublish round trip), so
    the learner goes from one step to the next without waiting on the coordinator
    (docs/async-schedule.md). Never across a checkpoint, a pause or stop request, or a due
    evaluation. false: each step is sent once the one before it was handled."""
    overlap_scoring: bool = True
    """Each replica's completions are scored while it generates its next request (one
    request scoring beside one generating, per replica), so a slow scorer (code run in the
    sandbox) adds to a step only what it takes beyond generation. false: a replica waits for
    its request's scores before it generates again. timing_s/score is the scoring time per
    step either way."""
    admission: AdmissionPolicy = "pace"
    """When generation may start, within max_staleness: pace (just in time to keep the
    learner busy, so samples are as fresh as the overlap allows: about 1 version stale when
    generation is faster than training; runs further ahead only when that would keep the
    learner waiting) or greedy (every slot the bound allows: samples max_staleness stale)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a group whose rewards are all equal (zero advantage under a
    group baseline) is not trained; a new prompt takes its place until the batch is full.
    Filtered prompts count as consumed (trained.jsonl marks them "filtered")."""
    dynamic_sampling_max_rounds: int = knob(10, ge=1)
    """Safety valve: once this many batches' worth of groups were filtered for one step,
    equal groups are trained after all (counted), so a solved task cannot stall the run."""
    rollout_addresses: list[str] = knob(
        default_factory=list, free="host:port, checked when the coordinator connects"
    )
    """host:port of each rollout replica (deploy/launch.sh fills these in)."""
    reward_address: str = knob("", free="host:port, checked when the coordinator connects")
    """host:port of the reward service."""
    environment_address: str = knob("", free="host:port, checked when the coordinator connects")
    """host:port of the environment service (deploy/launch.sh sets it when environment.envs
    is non-empty); empty: multi-turn episodes run their environments in process."""
    learner_address: str = knob("", free="host:port, checked when the coordinator connects")
    """host:port of the learner (rank 0)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation while training (docs/evaluation.md): off until ``sets`` lists a
    dataset."""
    channel: ChannelConfig = field(default_factory=ChannelConfig)
    """Client settings for every service call."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Control API (status / pause / resume / stop)."""
    save_checkpoint: bool = True
    """Save the final policy as a Hugging Face checkpoint (<run dir>/checkpoints/hf/step_N)."""
    checkpoint_every: int = knob(50, ge=0)
    """Steps between resumable checkpoints (learner train state + schedule state); one is
    also written on stop / SIGTERM and at the end. 0: only on stop and at the end."""
    keep_checkpoints: int = knob(2, ge=1)
    """Complete checkpoints kept (older ones are removed)."""
    replica_rejoin_timeout_s: float = knob(300.0, ge=0)
    """How long a failed rollout replica is waited for (the launcher restarts it) before it
    stays out of the rotation; while no replica serves, the job waits this long."""
    replica_stall_timeout_s: float = knob(20.0, ge=0)
    """A rollout replica that holds a request and shows no sign of life for this long has
    failed: no answer to a liveness probe (a status call, probed every quarter of this), or
    answers while its engine makes no progress (``engine_steps`` still; ``liveness.py``). Its
    prompts go to the others and it rejoins after a weight refit. A live replica answers in
    milliseconds and steps many times a second even while it generates, so this bounds host
    hiccups (GC, swap, an oversubscribed CPU) and the longest single engine step or weight
    apply, not generation length. 0: never probed (only the call's deadline,
    coordinator.channel.timeout_s)."""
    service_wait_s: float = knob(120.0, ge=0)
    """How long an unreachable reward service is retried (it may be restarting)."""
    progress: bool = True
    """Show a progress bar with live reward."""
    loggers: list[str] = knob(default_factory=lambda: ["jsonl"], choices=LOGGERS)
    """Where step metrics go, with the same names and the global step: jsonl
    (<run dir>/metrics.jsonl, always written, listed or not), tensorboard
    (<run dir>/tensorboard/), wandb (honours WANDB_MODE=offline, WANDB_PROJECT), mlflow
    (MLFLOW_TRACKING_URI). wandb and mlflow must be installed when listed."""

    def validate(self) -> None:
        raise_problems(
            [
                *field_problems(self, "coordinator"),
                "coordinator.dynamic_sampling: needs coordinator.group_size >= 2 (a group of "
                "one always has equal rewards)"
                if self.dynamic_sampling and self.group_size < 2
                else None,
            ]
        )
