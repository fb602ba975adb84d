"""The multi-turn loop: token-exact trajectories, loss masks, versions, limits and failures.

The engine here is a scripted fake (``generate`` answers from a list of turns per episode) so
every id of a trajectory is known in advance; the tokenizers are the built-in ones (character
and ChatML BPE), so the chat-template arithmetic is the real thing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridflow.coordinator.config import MultiTurnConfig
from hybridflow.coordinator.episode_record import EpisodeRecord, episode_metrics
from hybridflow.coordinator.episodes import EnvironmentDown, EpisodeRunner
from hybridflow.data.datasets import PromptRecord
from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.envs.runner import LocalEnvironments
from hybridflow.errors import Unavailable
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer
from hybridflow.types import Completion, SamplingParams

ENV = f"{__name__}:CountdownEnv"


class CountdownEnv:
    """Says "again" until the policy has spoken ``turns`` times (from the task's extra_info);
    reward 0.25 per turn, 1 more at the end; ``raise_at`` makes that step raise."""

    def reset(self, task: Task) -> tuple[Message, ...]:
        if task.extra_info.get("reset_raises"):
            raise KeyError("no such level")
        self.left = int(task.extra_info.get("turns", 2))
        self.raise_at = task.extra_info.get("raise_at")
        self.seen: list[str] = []
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        self.seen.append(action)
        if self.raise_at is not None and len(self.seen) == self.raise_at:
            raise RuntimeError("boom")
        self.left -= 1
        if self.left <= 0:
            return StepResult(reward=1.25, done=True, info={"success": True, "tool_calls": 1})
        return StepResult(
            observation=(Message("tool", f"again {self.left}"),),
            reward=0.25,
            info={"tool_calls": 1},
        )


class ScriptedEngine:
    """``generate`` for the loop: each context gets the next scripted turn of the episode
    whose prompt it starts with; records every context it was given."""

    def __init__(self, tokenizer, turns: list[str], version: int = 3, eos: bool = True) -> None:
        self.tok = tokenizer
        self.turns = [
            np.asarray(tokenizer.encode(t, add_special_tokens=False), np.int32) for t in turns
        ]
        self.version = version
        self.eos = eos
        self.contexts: list[np.ndarray] = []
        self.calls = 0

    def __call__(self, contexts, params, request_id):
        assert params.n == 1
        out = []
        for ctx in contexts:
            self.contexts.append(np.asarray(ctx))
            turn = self.turns[min(self.calls, len(self.turns) - 1)]
            ids = np.concatenate([turn, [self.tok.eos_token_id]]) if self.eos else turn
            out.append(
                [
                    Completion(
                        token_ids=ids.astype(np.int32),
                        logprobs=np.full(ids.size, -0.5, np.float32),
                        finish_reason="stop" if self.eos else "length",
                        policy_version=self.version,
                    )
                ]
            )
        self.calls += 1
        self.version += 1  # weights change between turns
        return out


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen3"])
def tokenizer(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return load_tokenizer(ensure_builtin_model(request.param, root=Path(root)))


def record(prompt: str = "hi", **extra) -> PromptRecord:
    return PromptRecord(
        prompt_text=prompt,
        prompt_ids=np.asarray([5, 6], np.int32),
        data_source="test",
        ground_truth=None,
        extra_info=extra,
        task_prompt=prompt,
    )


def runner(tokenizer, **cfg) -> EpisodeRunner:
    return EpisodeRunner(
        LocalEnvironments(), ChatTokens(tokenizer), MultiTurnConfig(env=ENV, **cfg)
    )


def test_trajectory_is_generated_ids_plus_observation_ids(tokenizer):
    chat = ChatTokens(tokenizer)
    engine = ScriptedEngine(tokenizer, ["12", "34", "56"])
    batch = runner(tokenizer, max_turns=5).run(
        [record("7+8", turns=3)], SamplingParams(n=2, max_new_tokens=8), engine, "q"
    )
    assert [len(g) for g in batch.groups] == [2]
    opening = chat.opening([Message("user", "7+8")])
    eos = tokenizer.eos_token_id
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    obs2 = chat.observation([Message("tool", "again 2")], True).tolist()
    obs1 = chat.observation([Message("tool", "again 1")], True).tolist()
    expected = [*enc("12"), eos, *obs2, *enc("34"), eos, *obs1, *enc("56"), eos]
    flags = [1] * (len(enc("12")) + 1) + [0] * len(obs2) + [1] * (len(enc("34")) + 1)
    flags += [0] * len(obs1) + [1] * (len(enc("56")) + 1)
    for c in batch.groups[0]:
        assert c.prompt_ids.tolist() == opening.tolist()
        assert c.token_ids.tolist() == expected
        assert c.loss_mask.tolist() == flags
        assert c.logprobs[c.loss_mask == 0].tolist() == [0.0] * (len(obs1) + len(obs2))
        assert set(c.logprobs[c.loss_mask == 1].tolist()) == {-0.5}
        assert set(c.token_versions[c.loss_mask == 0].tolist()) == {-1}
        # one version per turn, rising between turns; the trajectory counts its oldest
        assert sorted(set(c.token_versions[c.loss_mask == 1].tolist())) == [3, 4, 5]
        assert c.policy_version == 3
        # Each turn's reward sits on the turn's last policy token (the EOS it ended with).
        turn_ends = [
            i
            for i in range(len(flags))
            if flags[i] == 1 and (i + 1 == len(flags) or flags[i + 1] == 0)
        ]
        assert np.flatnonzero(c.turn_rewards).tolist() == turn_ends
        assert c.turn_rewards[turn_ends].tolist() == [0.25, 0.25, 1.25]
    # Each turn's context was exactly the opening plus everything appended so far.
    assert engine.contexts[0].tolist() == opening.tolist()
    assert engine.contexts[2].tolist() == [
        *opening.tolist(),
        *expected[: len(enc("12")) + 1 + len(obs2)],
    ]
    assert batch.results[0][0].score == pytest.approx(0.25 + 0.25 + 1.25)
    assert batch.records[0][0].turns == 3 and batch.records[0][0].success
    assert batch.records[0][0].finish == "done"
    # Under ChatML (whose generation prompt is the assistant turn's own header), the ids
    # decode to the conversation as the template renders it. (The character template has
    # no generation prompt; its rendering puts a newline before each assistant turn that
    # a sampled turn never has.)
    if "<|im_start|>" not in str(tokenizer.chat_template):
        return
    text = tokenizer.decode([*opening.tolist(), *expected])
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "7+8"},
            {"role": "assistant", "content": "12"},
            {"role": "tool", "content": "again 2"},
            {"role": "assistant", "content": "34"},
            {"role": "tool", "content": "again 1"},
            {"role": "assistant", "content": "56"},
        ],
        tokenize=False,
    )
    assert rendered.startswith(text)


def test_max_turns_and_max_total_tokens_end_episodes(tokenizer):
    engine = ScriptedEngine(tokenizer, ["1"])
    batch = runner(tokenizer, max_turns=2).run(
        [record(turns=9)], SamplingParams(n=1, max_new_tokens=4), engine, "q"
    )
    (c,), (rec,) = batch.groups[0], batch.records[0]
    assert rec.turns == 2 and rec.finish == "max_turns" and c.finish_reason == "length"
    assert c.loss_mask[-1] == 1  # a trajectory ends on a policy token

    engine = ScriptedEngine(tokenizer, ["123456789"], eos=False)
    batch = runner(tokenizer, max_turns=9, max_total_tokens=6).run(
        [record(turns=9)], SamplingParams(n=1, max_new_tokens=20), engine, "q"
    )
    (c,), (rec,) = batch.groups[0], batch.records[0]
    assert c.token_ids.size <= 6 and rec.finish == "max_total_tokens"
    assert c.token_ids.tolist() == engine.turns[0][: c.token_ids.size].tolist()  # a prefix
    assert LocalEnvironments().num_live == 0


def test_environment_error_ends_that_episode_only(tokenizer):
    envs = LocalEnvironments()
    run = EpisodeRunner(envs, ChatTokens(tokenizer), MultiTurnConfig(env=ENV, max_turns=4))
    engine = ScriptedEngine(tokenizer, ["1", "2", "3"])
    batch = run.run(
        [record(turns=3, raise_at=2), record(turns=2)],
        SamplingParams(n=1, max_new_tokens=4),
        engine,
        "q",
    )
    bad, good = batch.results[0][0], batch.results[1][0]
    assert batch.groups[0][0].turn_rewards is None  # a failed episode scores 0, no turn rewards
    assert bad.score == 0.0 and "boom" in (bad.error or "")
    assert batch.records[0][0].finish == "error" and batch.records[0][0].turns == 2
    assert good.error is None and good.score == pytest.approx(0.25 + 1.25)
    assert envs.num_live == 0


def test_reset_error_keeps_the_group_size(tokenizer):
    engine = ScriptedEngine(tokenizer, ["1"])
    batch = runner(tokenizer).run(
        [record(reset_raises=True)], SamplingParams(n=2, max_new_tokens=4), engine, "q"
    )
    assert len(batch.groups[0]) == 2  # one policy turn each, on the dataset's own prompt
    assert engine.contexts[0].tolist() == [5, 6]
    for result, rec in zip(batch.results[0], batch.records[0]):
        assert result.score == 0.0 and "no such level" in (result.error or "")
        assert rec.finish == "error" and rec.turns == 1


def test_a_bad_environment_path_is_not_an_episode_error(tokenizer):
    run = EpisodeRunner(
        LocalEnvironments(), ChatTokens(tokenizer), MultiTurnConfig(env=f"{__name__}:NoSuchEnv")
    )
    with pytest.raises(ValueError, match="NoSuchEnv"):
        run.run([record()], SamplingParams(n=2), ScriptedEngine(tokenizer, ["1"]), "q")


class DownEnvironments:
    def reset(self, episode_id, env, task):
        raise Unavailable("connection refused")

    def step(self, episode_id, action):  # pragma: no cover - never reached
        raise AssertionError

    def close(self, episode_id):
        raise Unavailable("connection refused")


def test_environment_service_down_fails_the_request(tokenizer):
    run = EpisodeRunner(DownEnvironments(), ChatTokens(tokenizer), MultiTurnConfig(env=ENV))
    with pytest.raises(EnvironmentDown):
        run.run([record()], SamplingParams(n=2), ScriptedEngine(tokenizer, ["1"]), "q")


def test_replica_failure_closes_live_episodes(tokenizer):
    envs = LocalEnvironments()
    run = EpisodeRunner(envs, ChatTokens(tokenizer), MultiTurnConfig(env=ENV, max_turns=4))

    calls = []

    def generate(contexts, params, request_id):
        calls.append(request_id)
        if len(calls) == 2:
            raise Unavailable("replica gone")
        return ScriptedEngine(tokenizer, ["1"])(contexts, params, request_id)

    with pytest.raises(Unavailable):
        run.run([record(turns=5)], SamplingParams(n=3), generate, "q")
    assert envs.num_live == 0


def test_episode_metrics():
    records = [
        EpisodeRecord(
            turns=2,
            tool_calls=1,
            success=True,
            policy_tokens=6,
            total_tokens=10,
            env_calls=3,
            env_seconds=0.3,
            finish="done",
        ),
        EpisodeRecord(
            turns=4,
            tool_errors=2,
            policy_tokens=4,
            total_tokens=10,
            env_calls=5,
            env_seconds=0.5,
            finish="max_turns",
        ),
    ]
    m = episode_metrics(records)
    assert m["episode/turns/mean"] == 3.0
    assert m["episode/tool_use_rate"] == 0.5
    assert m["episode/tool_errors/mean"] == 1.0
    assert m["episode/success_rate"] == 0.5
    assert m["episode/turns_per_success"] == 2.0
    assert m["episode/policy_token_frac"] == pytest.approx(0.5)
    assert m["episode/env_latency_s/mean"] == pytest.approx(0.1)
    assert m["episode/finish/max_turns"] == 0.5


def test_service_failing_between_resets_leaves_no_episode_live(tokenizer):
    envs = LocalEnvironments()

    class FailsOnSecondReset:
        resets = 0

        def reset(self, episode_id, env, task):
            self.resets += 1
            if self.resets == 2:
                raise Unavailable("deadline exceeded")
            return envs.reset(episode_id, env, task)

        def step(self, episode_id, action):  # pragma: no cover - never reached
            return envs.step(episode_id, action)

        def close(self, episode_id):
            envs.close(episode_id)

    run = EpisodeRunner(FailsOnSecondReset(), ChatTokens(tokenizer), MultiTurnConfig(env=ENV))
    with pytest.raises(EnvironmentDown):
        run.run([record()], SamplingParams(n=3), ScriptedEngine(tokenizer, ["1"]), "q")
    assert envs.num_live == 0
