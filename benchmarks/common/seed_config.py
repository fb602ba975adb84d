"""The seed guide's benchmark config (verl's §3.2 layout) translated into a suite config.

The seed writes a suite as hardware and workload, not as job overrides:

    model: {name, seq_length, batch_size_per_gpu}
    resources: {actor_gpus, critic_gpus, reward_gpus}
    parallel_strategy: fsdp
    workload: {num_episodes, prompt_dataset}

``translate_seed_config`` maps it onto a ``BenchmarkConfig`` over the quickstart job, one
asynchronous variant (the seed's "async sampling pipeline, PPO updates"), and returns one
line per item it could not honour as written ("seed config: <key>=<value>: <what instead>").
With ``scale_to_machine`` the run fits this machine: learner ranks and rollout replicas capped
at its CPUs, steps at ``max_steps``. GPU placement is not mapped: the run is a CPU run.

Imports no torch; knows nothing of how suites run (``runner.py`` does).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common.config import BenchmarkConfig, Variant

REPO = Path(__file__).resolve().parents[2]
SHAREGPT_SAMPLE = REPO / "benchmarks" / "data" / "sharegpt_sample.json"
"""64 short ShareGPT-format conversations written for this repo (the seed's "sharegpt")."""
FALLBACK_MODEL = "builtin:tiny"
"""The model used when the seed names a hub model (nothing is downloaded here)."""
FALLBACK_DATASET = "builtin:arith"
"""The dataset used when the seed names a hub dataset other than sharegpt."""
CPU_MAX_STEPS = 20
"""Steps of a scaled CPU run (``workload.num_episodes`` above this is capped)."""
FSDP_NAMES = ("fsdp", "fsdp2")
"""``parallel_strategy`` values our learner honours (it shards with FSDP2)."""
SEED_VARIANT = Variant("async", ["coordinator.max_staleness=1", "learner.loss.off_policy=tis"])
"""The one variant: asynchronous, one version of lag, truncated importance sampling."""
RUN_OVERRIDES = ["coordinator.save_checkpoint=false", "coordinator.progress=false"]
"""Overrides every translated run gets (a benchmark keeps no checkpoint, draws no bar)."""

Notice = Callable[[str, Any, str], None]
"""notice(key, value, what was done instead): records one line."""


@dataclass
class SeedModel:
    """``model:``: what to train and at what size."""

    name: str = FALLBACK_MODEL
    """Hub id, local checkpoint directory or builtin: name."""
    seq_length: int = 128
    """Prompt plus response tokens."""
    batch_size_per_gpu: int = 4
    """Samples per device per forward pass."""


@dataclass
class SeedResources:
    """``resources:``: devices per role."""

    actor_gpus: int = 1
    """Devices of the actor (training and generation)."""
    critic_gpus: int = 0
    """Devices of the critic; > 0 means PPO with a value model."""
    reward_gpus: int = 0
    """Devices of the reward model."""


@dataclass
class SeedWorkload:
    """``workload:``: how long and on what."""

    num_episodes: int = 100
    """Training iterations."""
    prompt_dataset: str = FALLBACK_DATASET
    """sharegpt, a dataset file or spec (builtin:arith, sharegpt:PATH, .jsonl, .parquet)."""


@dataclass
class SeedConfig:
    """The seed guide's §3.2 config file."""

    model: SeedModel = field(default_factory=SeedModel)
    """The model section."""
    resources: SeedResources = field(default_factory=SeedResources)
    """The resources section."""
    parallel_strategy: str = "fsdp"
    """Training parallelism (we honour fsdp)."""
    workload: SeedWorkload = field(default_factory=SeedWorkload)
    """The workload section."""

    def validate(self) -> None:
        for key, value in (
            ("model.seq_length", self.model.seq_length),
            ("model.batch_size_per_gpu", self.model.batch_size_per_gpu),
            ("resources.actor_gpus", self.resources.actor_gpus),
            ("workload.num_episodes", self.workload.num_episodes),
        ):
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        for key, value in (
            ("resources.critic_gpus", self.resources.critic_gpus),
            ("resources.reward_gpus", self.resources.reward_gpus),
        ):
            if value < 0:
                raise ValueError(f"{key} must be >= 0, got {value}")


@dataclass(frozen=True)
class Machine:
    """What the run has: the translation's only view of the hardware."""

    num_cpus: int
    """CPUs this process may use."""
    num_gpus: int = 0
    """CUDA devices (not used by the translation beyond its notices)."""


@dataclass
class SeedTranslation:
    """A seed config as a suite config, plus what could not be honoured."""

    config: BenchmarkConfig
    """The suite config to run."""
    notices: list[str]
    """One line per item not honoured as written."""


def is_seed_layout(raw: Any) -> bool:
    """A top-level ``model:`` mapping, or ``resources:`` / ``workload:`` sections."""
    return isinstance(raw, dict) and (
        isinstance(raw.get("model"), dict) or "resources" in raw or "workload" in raw
    )


def translate_seed_config(
    seed: SeedConfig,
    machine: Machine,
    scale_to_machine: bool = True,
    max_steps: int = CPU_MAX_STEPS,
    suite: str = "throughput",
) -> SeedTranslation:
    """The suite config and notices for ``seed`` on ``machine`` (see the module docstring)."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    notices: list[str] = []

    def notice(key: str, value: Any, what: str) -> None:
        notices.append(f"seed config: {key}={value}: {what}")

    model = _model(seed.model.name, notice)
    prompt_tokens, response_tokens = _lengths(seed.model.seq_length, model, notice)

    actor = seed.resources.actor_gpus
    ranks = min(actor, machine.num_cpus) if scale_to_machine else actor
    where = "no GPU here" if machine.num_gpus == 0 else "GPU placement is not mapped"
    notice(
        "resources.actor_gpus",
        actor,
        f"{where}, using {ranks} CPU learner ranks and {ranks} rollout replicas",
    )
    batch = seed.model.batch_size_per_gpu
    algorithm = "ppo" if seed.resources.critic_gpus > 0 else "grpo"
    if seed.resources.critic_gpus > 0:
        notice(
            "resources.critic_gpus",
            seed.resources.critic_gpus,
            "PPO's critic trains on the learner ranks (no devices of its own)",
        )
    if seed.resources.reward_gpus > 0:
        notice(
            "resources.reward_gpus",
            seed.resources.reward_gpus,
            "the reward service has no device of its own yet (rule scorers on CPU)",
        )
    if seed.parallel_strategy.lower() not in FSDP_NAMES:
        notice("parallel_strategy", seed.parallel_strategy, "not honoured, the learner runs FSDP2")

    steps = seed.workload.num_episodes
    if scale_to_machine and steps > max_steps:
        notice("workload.num_episodes", steps, f"capped at {max_steps} steps to fit this machine")
        steps = max_steps
    data = _dataset(seed.workload.prompt_dataset, notice)

    overrides = [
        f"model={model}",
        f"coordinator.data={data}",
        f"coordinator.num_steps={steps}",
        f"coordinator.prompts_per_step={batch * ranks}",
        f"coordinator.max_prompt_tokens={prompt_tokens}",
        f"coordinator.sampling.max_new_tokens={response_tokens}",
        f"learner.algorithm={algorithm}",
        f"learner.update.micro_batch_size={batch}",
        f"learner.topology.nproc_per_node={ranks}",
        f"rollout.replicas={ranks}",
        *RUN_OVERRIDES,
    ]
    config = BenchmarkConfig(
        suite=suite,
        overrides=overrides,
        variants=[Variant(SEED_VARIANT.name, list(SEED_VARIANT.overrides))],
        repeats=1,
        warmup_steps=max(1, min(3, steps // 4)),
        profile_steps=min(10, steps),
    )
    config.validate()
    return SeedTranslation(config, notices)


def _model(name: str, notice: Notice) -> str:
    if name.startswith("builtin:"):
        return name
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return str(path.resolve())
    notice("model.name", name, f"hub models are not downloaded here, using {FALLBACK_MODEL}")
    return FALLBACK_MODEL


def max_positions(model: str) -> int | None:
    """The model's ``max_position_embeddings`` (None when its config does not say)."""
    if model.startswith("builtin:"):
        from hybridflow.models.builtin import builtin_specs

        spec = builtin_specs().get(model.removeprefix("builtin:"))
        return None if spec is None else spec.max_position_embeddings
    config = json.loads((Path(model) / "config.json").read_text())
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) else None


def _lengths(seq_length: int, model: str, notice: Notice) -> tuple[int, int]:
    """(prompt, response) tokens: the sequence split in halves, within the model's positions."""
    limit = max_positions(model)
    total = seq_length if limit is None else min(seq_length, limit)
    if total < 2:
        raise ValueError(f"model.seq_length must be >= 2 (a prompt and a response), got {total}")
    prompt, response = total // 2, total - total // 2
    held = "" if total == seq_length else f"{model} holds {limit} positions, "
    notice(
        "model.seq_length",
        seq_length,
        f"{held}using {prompt} prompt + {response} response tokens "
        "(coordinator.max_prompt_tokens, coordinator.sampling.max_new_tokens)",
    )
    return prompt, response


def _dataset(name: str, notice: Notice) -> str:
    if name.lower() == "sharegpt":
        sample = SHAREGPT_SAMPLE.relative_to(REPO)
        notice(
            "workload.prompt_dataset",
            name,
            f"ShareGPT is not downloaded here, using the 64-conversation sample {sample}",
        )
        return f"sharegpt:{SHAREGPT_SAMPLE}"
    if name.startswith(("builtin:", "sharegpt:")):
        return name
    path = Path(name).expanduser()
    if path.is_file():
        # A .json list is ShareGPT's own format; .jsonl / .parquet are verl rows.
        return f"sharegpt:{path.resolve()}" if path.suffix == ".json" else str(path.resolve())
    notice(
        "workload.prompt_dataset",
        name,
        f"hub datasets are not downloaded here, using {FALLBACK_DATASET}",
    )
    return FALLBACK_DATASET
