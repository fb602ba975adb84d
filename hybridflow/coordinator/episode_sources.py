"""Which episodes a multi-turn job runs: ``episode_runner`` builds the job's
``EpisodeSource``, the coordinator's own loop over an environment class or agent episodes in
the environment service."""

from __future__ import annotations

from typing import Any

from hybridflow.coordinator.agent_episodes import AgentRunner
from hybridflow.coordinator.config import MultiTurnConfig
from hybridflow.coordinator.episodes import EpisodeRunner, EpisodeSource
from hybridflow.envs.chat_tokens import ChatTokens


def episode_runner(
    config: MultiTurnConfig, services: Any, greedy_baseline: bool
) -> EpisodeSource | None:
    """The job's multi-turn loop over ``services`` (``coordinator.services.Services``: its
    environment client and tokenizer), None for single-turn rollouts; ValueError when the
    job cannot run episodes (ReMax, a bad environment path, no client)."""
    if not config.enabled:
        return None
    if greedy_baseline:
        raise ValueError(
            "coordinator.multi_turn: ReMax (a greedy baseline per prompt) is not supported "
            "for multi-turn episodes; use grpo, rloo or gae"
        )
    if services.environments is None or services.tokenizer is None:
        raise ValueError(
            "coordinator.multi_turn.env is set but the job has no environment client or "
            "tokenizer to run episodes with"
        )
    if config.agent:
        if not hasattr(services.environments, "run_agent"):
            raise ValueError(
                "coordinator.multi_turn.agent: agents run in the environment service; this job "
                "has none (coordinator.environment_address is empty)"
            )
        return AgentRunner(services.environments, config)
    from hybridflow.envs.runner import load_environment_class

    load_environment_class(config.env)  # a bad path fails here, before any work
    return EpisodeRunner(services.environments, ChatTokens(services.tokenizer), config)
