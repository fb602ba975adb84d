"""Multi-turn episodes: the policy acts, the environment answers, until done.

The loop lives on the coordinator side, in the dispatcher thread of the replica that serves
the request (docs/environments.md says why: the rollout stays a stateless engine, so a replica
dying mid-episode costs only a re-queue; weights may change between turns and each turn's
tokens carry the version that sampled them; the coordinator already holds the tokenizer, the
dataset and the exactly-once audit).

All episodes of one request advance turn by turn: each turn is one ``Generate`` call holding
every live episode's whole context (its prompt, its earlier turns and observations) with
``n = 1``, so the engine batches them and vLLM's prefix cache serves what an episode already
read; then the environment answers every episode's turn, ``env_concurrency`` of them at once
(each on one thread; the tokens are handled on the caller's). A trajectory is built by appending only (``hybridflow.envs.chat_tokens``): the ids the
engine sampled, then the observation's ids, each tokenised once. The loss mask is 1 exactly
on the sampled ids; their log-probs and versions come from the engine, the observation's are
0 and -1. An episode ends when the environment says done, at ``max_turns`` policy turns, or
when its response (policy plus observation tokens) would pass ``max_total_tokens``; a turn
that would pass it is cut to fit (a prefix of what was sampled, so still exactly on-policy).

Failures: an environment that raises ends its own episode with an error (reward 0, trained
like a sample whose scoring failed); an unreachable environment service fails the request
with ``EnvironmentDown`` and the dispatcher restarts its episodes from their tasks; a replica
failing mid-episode fails the request as a single-turn one would (the prompts are re-queued).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from hybridflow.arrays import TokenArray
from hybridflow.coordinator.config import MultiTurnConfig
from hybridflow.coordinator.dataflow import Prompt, ScoredGroup
from hybridflow.coordinator.episode_record import EpisodeRecord
from hybridflow.envs.base import StepResult, Task
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.envs.runner import EnvironmentClient, EpisodeError
from hybridflow.errors import ServiceError
from hybridflow.types import Completion, SamplingParams, ScoreResult

Generate = Callable[[list[TokenArray], SamplingParams, str], list[list[Completion]]]


class EpisodeSource(Protocol):
    """What runs a request's multi-turn episodes: the coordinator's own loop
    (``EpisodeRunner``, over environment classes) or agent episodes (``AgentRunner``)."""

    def run(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams,
        generate: Generate,
        request_id: str,
        replica_address: str = "",
    ) -> EpisodeBatch: ...


class EnvironmentDown(RuntimeError):
    """The environment service did not answer: the request's episodes restart from their
    tasks (the dispatcher re-queues its prompts; the replica is not to blame)."""


@dataclass
class _Episode:
    episode_id: str
    prompt_index: int
    prompt_ids: TokenArray
    error: str | None = None
    reward: float = 0.0
    ids: list[np.ndarray] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    versions: list[np.ndarray] = field(default_factory=list)
    mask: list[np.ndarray] = field(default_factory=list)
    used: int = 0
    rewarded: list[tuple[int, float]] = field(default_factory=list)
    """(response position of a turn's last policy token, that turn's reward)."""
    record: EpisodeRecord = field(default_factory=EpisodeRecord)

    def context(self) -> TokenArray:
        return np.concatenate([self.prompt_ids, *self.ids]).astype(np.int32, copy=False)

    def add_policy(self, completion: Completion, take: int) -> None:
        ids = completion.token_ids[:take]
        versions = (
            completion.token_versions[:take]
            if completion.token_versions is not None
            else np.full(take, completion.policy_version, dtype=np.int32)
        )
        self.ids.append(ids)
        self.logprobs.append(completion.logprobs[:take])
        self.versions.append(versions)
        self.mask.append(np.ones(take, dtype=np.uint8))
        self.used += take
        self.record.turns += 1
        self.record.policy_tokens += take

    def add_observation(self, ids: TokenArray) -> None:
        self.ids.append(ids)
        self.logprobs.append(np.zeros(ids.size, dtype=np.float32))
        self.versions.append(np.full(ids.size, -1, dtype=np.int32))
        self.mask.append(np.zeros(ids.size, dtype=np.uint8))
        self.used += ids.size

    def completion(self) -> Completion:
        versions = np.concatenate(self.versions)
        mask = np.concatenate(self.mask)
        self.record.total_tokens = int(mask.size)
        turn_rewards = None
        if self.error is None:  # a failed episode scores 0: no per-turn rewards
            turn_rewards = np.zeros(mask.size, dtype=np.float32)
            for position, reward in self.rewarded:
                turn_rewards[position] += reward
        return Completion(
            token_ids=np.concatenate(self.ids),
            logprobs=np.concatenate(self.logprobs),
            finish_reason="stop" if self.record.finish == "done" else "length",
            policy_version=int(versions[mask == 1].min()),
            token_versions=versions,
            loss_mask=mask,
            prompt_ids=self.prompt_ids,
            turn_rewards=turn_rewards,
        )


@dataclass
class EpisodeBatch:
    """A request's episodes, grouped like ``Generate``'s answer (prompt-major)."""

    groups: list[list[Completion]]
    results: list[list[ScoreResult]]
    records: list[list[EpisodeRecord]]

    def scored(self, prompts: Sequence[Prompt]) -> list[ScoredGroup]:
        """The request's groups as the buffer takes them, scored by their environment."""
        return [
            ScoredGroup(p, g, r, None, rec)
            for p, g, r, rec in zip(prompts, self.groups, self.results, self.records, strict=True)
        ]


def task_of(prompt: Prompt) -> Task:
    """The environment's view of a dataset row."""
    return Task(
        prompt=str(getattr(prompt, "task_prompt", "") or prompt.prompt_text),
        ground_truth=prompt.ground_truth,
        data_source=prompt.data_source,
        extra_info=dict(prompt.extra_info),
    )


class EpisodeRunner:
    """Runs one request's episodes against an ``EnvironmentClient`` (module docstring)."""

    def __init__(
        self,
        envs: EnvironmentClient,
        chat: ChatTokens,
        config: MultiTurnConfig,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not config.enabled:
            raise ValueError("EpisodeRunner needs coordinator.multi_turn.env")
        self.envs = envs
        self.chat = chat
        self.config = config
        self.clock = clock

    def run(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams,
        generate: Generate,
        request_id: str,
        replica_address: str = "",
    ) -> EpisodeBatch:
        """The request's episodes on the replica ``generate`` reaches (``replica_address``
        names it for agent episodes; this loop does not need it)."""
        episodes: list[_Episode] = []
        live = episodes
        turn = 0
        try:
            for p, prompt in enumerate(prompts):
                for j in range(params.n):
                    episodes.append(self._reset(f"{request_id}-{p}-{j}", p, prompt))
            live = list(episodes)
            while live:
                turn_params = replace(
                    params,
                    n=1,
                    seed=None if params.seed is None else (params.seed + 7919 * turn) % 2**31,
                )
                answers = generate(
                    [e.context() for e in live], turn_params, f"{request_id}-t{turn}"
                )
                if len(answers) != len(live) or any(len(a) != 1 for a in answers):
                    raise ValueError(
                        f"rollout answered {[len(a) for a in answers]} completions for "
                        f"{len(live)} episode contexts (one each expected)"
                    )
                acting = [
                    (episode, *taken)
                    for episode, (completion,) in zip(live, answers, strict=True)
                    if (taken := self._policy_turn(episode, completion)) is not None
                ]
                answered = self._map(self._step, [(e, action) for e, action, _ in acting])
                for (episode, _, ended_with_eos), result in zip(acting, answered, strict=True):
                    if result is not None:
                        self._after_step(episode, result, ended_with_eos)
                live = [e for e in live if not e.record.finish]
                turn += 1
        except BaseException:
            for episode in live:
                self._close_quietly(episode.episode_id)
            raise
        n = params.n
        groups, results, records = [], [], []
        for p in range(len(prompts)):
            mine = episodes[p * n : (p + 1) * n]
            groups.append([e.completion() for e in mine])
            results.append(
                [
                    ScoreResult(0.0, e.error) if e.error is not None else ScoreResult(e.reward)
                    for e in mine
                ]
            )
            records.append([e.record for e in mine])
        return EpisodeBatch(groups, results, records)

    # ------------------------------------------------------------------ one episode
    def _reset(self, episode_id: str, index: int, prompt: Prompt) -> _Episode:
        """A fresh episode. If the environment's reset raised, the episode still takes one
        policy turn on the dataset's own prompt (so its group keeps its size) and ends with
        the error, reward 0."""
        start = self.clock()
        try:
            opening = self._env(
                lambda: self.envs.reset(episode_id, self.config.env, task_of(prompt))
            )
        except EpisodeError as exc:
            episode = _Episode(episode_id, index, prompt.prompt_ids, error=str(exc))
        else:
            episode = _Episode(episode_id, index, self.chat.opening(opening))
        episode.record.env_seconds += self.clock() - start
        episode.record.env_calls += 1
        return episode

    def _policy_turn(self, episode: _Episode, completion: Completion) -> tuple[str, bool] | None:
        """Appends the policy's turn; (its text for the environment, whether it ended with
        EOS), or None when the episode already ended with an error."""
        take = min(completion.token_ids.size, self.config.max_total_tokens - episode.used)
        ended_with_eos = completion.finish_reason == "stop" and take == completion.token_ids.size
        episode.add_policy(completion, take)
        if episode.error is not None:
            episode.record.finish = "error"
            return None
        return self.chat.decode_turn(completion.token_ids[:take]), ended_with_eos

    def _map(
        self, step: Callable[[_Episode, str], StepResult | None], calls: list[tuple[_Episode, str]]
    ) -> list[StepResult | None]:
        """``step`` over the calls, ``env_concurrency`` at once (in order)."""
        if len(calls) <= 1 or self.config.env_concurrency <= 1:
            return [step(*call) for call in calls]
        workers = min(len(calls), self.config.env_concurrency)
        with ThreadPoolExecutor(workers, thread_name_prefix="env-step") as pool:
            return list(pool.map(lambda call: step(*call), calls))

    def _after_step(self, episode: _Episode, result: StepResult, ended_with_eos: bool) -> None:
        cfg, record = self.config, episode.record
        episode.reward += float(result.reward)
        episode.rewarded.append((episode.used - 1, float(result.reward)))
        record.tool_calls += int(result.info.get("tool_calls", 0))
        record.tool_errors += int(result.info.get("tool_errors", 0))
        record.success = record.success or bool(result.info.get("success", False))
        if result.done:
            record.finish = "done"
            return
        if record.turns >= cfg.max_turns:
            record.finish = "max_turns"
        else:
            observation = self.chat.observation(result.observation, ended_with_eos)
            if episode.used + observation.size + 1 > cfg.max_total_tokens:
                record.finish = "max_total_tokens"  # no room for the observation and a turn
            else:
                episode.add_observation(observation)
                return
        self._close_quietly(episode.episode_id)

    def _step(self, episode: _Episode, action: str) -> StepResult | None:
        """The environment's answer; None when it failed (the episode ended with the error)."""
        start = self.clock()
        try:
            result = self._env(lambda: self.envs.step(episode.episode_id, action))
            if not result.done and not result.observation:
                self._close_quietly(episode.episode_id)
                raise EpisodeError(
                    f"episode {episode.episode_id!r}: step returned no observation and not done"
                )
        except EpisodeError as exc:
            episode.error = str(exc)
            episode.reward = 0.0
            episode.record.finish = "error"
            return None
        finally:
            episode.record.env_seconds += self.clock() - start
            episode.record.env_calls += 1
        return result

    def _env(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except ServiceError as exc:
            raise EnvironmentDown(f"environment service: {exc}") from exc

    def _close_quietly(self, episode_id: str) -> None:
        try:
            self.envs.close(episode_id)
        except Exception:  # noqa: BLE001 — closing is best effort; the service drops it anyway
            pass
