"""The job config: one YAML file with a section per service, loaded strictly.

Every process (each service and the coordinator) loads the whole file, so a typo anywhere
is caught by whichever starts first. Imports no torch and no grpc.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.loader import config_source, load_config, with_overrides
from hybridflow.config.ranges import raise_problems
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.services.environment.config import EnvironmentConfig
from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.preference_config import PreferenceConfig
from hybridflow.services.reward.config import RewardConfig
from hybridflow.services.rollout.config import RolloutConfig
from hybridflow.services.tinker.config import TinkerConfig
from hybridflow.weights.config import WeightSyncConfig


@dataclass
class DeployConfig:
    """How deploy/launch.sh runs the job."""

    run_root: str = knob("runs", free="a directory (non-empty: validate), made when a run starts")
    """Each run writes runs/<timestamp>/ under this directory."""
    health_timeout_s: float = knob(600.0, gt=0)
    """Seconds to wait for every service's health check."""
    stop_timeout_s: float = knob(60.0, ge=0)
    """On SIGTERM / Ctrl-C: seconds the coordinator gets to finish its step and save before
    it is killed; the services then get their own drain grace."""
    restart_budget: int = knob(3, ge=0)
    """Restarts per rollout / reward / environment service before the job stops."""
    restart_backoff_s: float = knob(1.0, ge=0)
    """Delay before a service's first restart; doubles with each further restart."""
    group_readable: bool = False
    """Run directories, checkpoints and logs readable by the owner's group (0750 / 0640);
    false: by the owner only (0700 / 0600). Others never read them."""

    def validate(self) -> None:
        """Each field's bound, plus: a non-empty run_root."""
        raise_problems(
            [
                *field_problems(self, "deploy"),
                None if self.run_root else "deploy.run_root: must be a non-empty path",
            ]
        )


@dataclass
class JobConfig:
    """Everything one training job needs; sections per service."""

    model: str = knob(
        "builtin:tiny", free="a model name or directory (required: validate), checked when it loads"
    )
    """Policy checkpoint: builtin:tiny or a local Hugging Face checkpoint directory."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout replicas."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward service."""
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    """Environment service of multi-turn episodes (started only when environment.envs lists
    a class)."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Learner service. The flat keys of earlier versions (learner.lr, learner.kl_coef, ...)
    still load, moved into these sections with a notice; learner.temperature and
    learner.max_new_tokens are taken from coordinator.sampling."""
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    """Coordinator: data and schedule."""
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    """How weights go from the learner to the rollout replicas."""
    deploy: DeployConfig = field(default_factory=DeployConfig)
    """Launcher settings."""
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    """Offline DPO / KTO / SFT: with preference.data set, deploy/launch.sh runs only this
    learner-side job (no rollout, reward service or coordinator)."""
    tinker: TinkerConfig = field(default_factory=TinkerConfig)
    """The Tinker-compatible service: with tinker.enabled, deploy/launch.sh runs only it, and
    the user's own loop drives training through the tinker SDK (docs/tinker.md)."""

    def validate(self) -> None:
        if not self.model:
            raise ValueError("model: required (builtin:tiny or a checkpoint directory)")
        # Loaded jobs take both from coordinator.sampling (config.fields.derived); a job
        # built in code must keep them equal.
        if abs(self.learner.temperature - self.coordinator.sampling.temperature) > 1e-9:
            raise ValueError(
                "learner.temperature must equal coordinator.sampling.temperature "
                "(log-probs must be taken under the sampling distribution)"
            )
        if (
            self.learner.overlong.buffer > 0
            and self.learner.max_new_tokens != self.coordinator.sampling.max_new_tokens
        ):
            raise ValueError(
                "learner.max_new_tokens must equal coordinator.sampling.max_new_tokens "
                "when learner.overlong.buffer > 0 (the penalty counts from the sampling limit)"
            )
        multi_turn = self.coordinator.multi_turn
        if multi_turn.env and multi_turn.agent:
            raise ValueError(
                "coordinator.multi_turn: set env (an environment class) or agent (an agent "
                "callable), not both"
            )
        if multi_turn.agent and multi_turn.agent not in self.environment.envs:
            raise ValueError(
                f"coordinator.multi_turn.agent {multi_turn.agent!r} is not in environment.envs "
                f"{list(self.environment.envs)}: agents run in the environment service, beside "
                "the endpoint they call (add it there)"
            )
        if multi_turn.env and self.environment.envs and multi_turn.env not in self.environment.envs:
            raise ValueError(
                f"coordinator.multi_turn.env {multi_turn.env!r} is not in environment.envs "
                f"{list(self.environment.envs)}: the environment service runs only the classes "
                "it lists (add it there, or empty environment.envs to run it in process)"
            )
        if self.environment.envs and not multi_turn.enabled:
            raise ValueError(
                "environment.envs starts the environment service, but coordinator.multi_turn.env "
                "is empty, so no episode would use it: set coordinator.multi_turn.env to one of "
                f"{list(self.environment.envs)}"
            )
        if self.tinker.enabled and self.preference.data:
            raise ValueError(
                "tinker.enabled and preference.data each make the job one process of its own: "
                "set one"
            )
        if self.preference.data and self.learner.topology.critic_nproc_per_node > 0:
            raise ValueError(
                "learner.topology.critic_nproc_per_node must be 0 for an offline preference job "
                "(preference.data is set; DPO / KTO / SFT train no critic)"
            )


def load_job_config(path: str | Path | None, overrides: Sequence[str] = ()) -> JobConfig:
    return load_config(JobConfig, path, overrides)


def override_job_config(
    job: JobConfig, path: str | Path | None, overrides: Sequence[str]
) -> JobConfig:
    """``job`` (loaded from ``path``) with further ``overrides``: what ``load_job_config``
    gives with them appended, the same checks and messages, without reading ``path`` again."""
    return with_overrides(job, overrides, config_source(path))
