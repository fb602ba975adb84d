"""Agent episodes (``coordinator.multi_turn.agent``): each of a request's prompts runs
``group_size`` episodes of the agent in the environment service (``env_concurrency`` at once), against the replica
that serves the request; what they captured are the request's groups, their agents' rewards the
scores.

The agent drives its own loop (through its episode's OpenAI-compatible endpoint, in the
environment service), so the coordinator only starts the episodes (``env_concurrency`` at
once) and collects them: each episode's segments (one unless a request broke its context,
``hybridflow/agents/capture.py``) are completions of its prompt's group, each scored with the
episode's reward. Failures: an agent that raised or hung ends its own episode (reward 0,
trained as a failed sample, as an environment's error); a replica that failed one of the
requests fails the whole request (``Unavailable``: the dispatcher re-queues its prompts,
the replica rejoins); an environment service that is gone is ``EnvironmentDown`` (the
prompts are generated again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from hybridflow.agents.runner import AgentEpisode
from hybridflow.coordinator.config import MultiTurnConfig
from hybridflow.coordinator.dataflow import Prompt
from hybridflow.coordinator.episode_record import EpisodeRecord
from hybridflow.coordinator.episodes import EnvironmentDown, EpisodeBatch, Generate, task_of
from hybridflow.errors import ServiceError, Unavailable
from hybridflow.types import Completion, SamplingParams, ScoreResult

log = logging.getLogger(__name__)


class AgentRunner:
    """Runs one request's agent episodes (module docstring)."""

    def __init__(self, envs: Any, config: MultiTurnConfig) -> None:
        """``envs``: the environment service's client (``run_agent``; it knows the
        service's agent_timeout_s, and each call's deadline from it)."""
        if not config.agent:
            raise ValueError("AgentRunner needs coordinator.multi_turn.agent")
        self.envs = envs
        self.config = config

    def run(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams,
        generate: Generate,
        request_id: str,
        replica_address: str = "",
    ) -> EpisodeBatch:
        if not replica_address:
            raise ValueError("agent episodes need the replica's address")
        calls = [
            (f"{request_id}-{p}-{j}", prompt, self._params(params, j))
            for p, prompt in enumerate(prompts)
            for j in range(params.n)
        ]

        def one(call: tuple[str, Prompt, SamplingParams]) -> AgentEpisode:
            episode_id, prompt, sampling = call
            try:
                return self.envs.run_agent(  # type: ignore[no-any-return]
                    episode_id,
                    self.config.agent,
                    task_of(prompt),
                    replica_address,
                    sampling,
                )
            except ServiceError as exc:
                raise EnvironmentDown(f"environment service: {exc}") from exc

        # env_concurrency at once (within the service's concurrency limit: the job config
        # checks): agents ask one completion at a time, and the service sends the requests
        # that meet on a replica together.
        workers = max(1, min(len(calls), self.config.env_concurrency))
        with ThreadPoolExecutor(workers, thread_name_prefix="agent") as pool:
            episodes = list(pool.map(one, calls))
        failed = next((e.replica_error for e in episodes if e.replica_error), "")
        if failed:
            raise Unavailable(f"an agent episode's request failed on the replica: {failed}")
        return _batch(prompts, params.n, episodes)

    @staticmethod
    def _params(params: SamplingParams, j: int) -> SamplingParams:
        seed = None if params.seed is None else (params.seed + 7919 * j) % 2**31
        return replace(params, n=1, seed=seed)


def _batch(prompts: Sequence[Prompt], n: int, episodes: list[AgentEpisode]) -> EpisodeBatch:
    groups: list[list[Completion]] = []
    results: list[list[ScoreResult]] = []
    records: list[list[EpisodeRecord]] = []
    for p in range(len(prompts)):
        completions, scores, recs = [], [], []
        for episode in episodes[p * n : (p + 1) * n]:
            record = _record(episode)
            trajectories = episode.trajectories or []
            if not trajectories:  # the agent failed before its first request: nothing ran
                record.finish = "error"
            for trajectory in trajectories:
                completions.append(trajectory)
                scores.append(
                    ScoreResult(0.0, episode.error)
                    if episode.error
                    else ScoreResult(episode.reward)
                )
                recs.append(record)
        if not completions:
            errors = sorted({e.error for e in episodes[p * n : (p + 1) * n]})
            log.warning(
                "every episode of a prompt failed before its first request (nothing to train; "
                "the prompt is audited as filtered): %s",
                "; ".join(errors)[:2000],
            )
        groups.append(completions)
        results.append(scores)
        records.append(recs)
    return EpisodeBatch(groups, results, records)


def _record(episode: AgentEpisode) -> EpisodeRecord:
    info = episode.info
    generated = sum(int(t.loss_mask.sum()) for t in episode.trajectories if t.loss_mask is not None)
    total = sum(int(t.token_ids.size) for t in episode.trajectories)
    return EpisodeRecord(
        turns=episode.num_requests,
        tool_calls=int(info.get("tool_calls", 0) or 0),
        tool_errors=int(info.get("tool_errors", 0) or 0),
        success=bool(info.get("success", False)),
        env_calls=1,
        policy_tokens=generated,
        total_tokens=total,
        finish="error" if episode.error else "done",
        segment_breaks=sum(episode.breaks.values()),
    )
