"""Token fidelity of multi-turn training, over both engines: for every trajectory the learner
trained on, the response ids are, id for id, the ids the engine generated (each turn, given
exactly the context before it) and the ids of the environment's observations, tokenised once
with the chat template; the loss mask is 1 on exactly the generated ids.

Real parts throughout: the coordinator's schedule (``TrainingJob``), the rollout engine (HF or
vLLM) on ``builtin:tiny-qwen3`` (ChatML), the learner training and publishing weights between
steps, an environment in process. The rollout and learner clients are wrapped only to record
what crossed them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridflow.coordinator.config import CoordinatorConfig, MultiTurnConfig, SamplingConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.data.datasets import PromptRecord
from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.trainer import twin_services
from tests.helpers import learner_config

ENV = f"{__name__}:EchoEnv"


class EchoEnv:
    """Answers each turn with the length of what it heard, as a tool message; done after two
    or three turns (by the task), so episodes differ in length."""

    def reset(self, task: Task) -> tuple[Message, ...]:
        self.turns, self.last = 0, 2 + len(task.prompt) % 2
        return (Message("user", task.prompt),)

    def step(self, action: str) -> StepResult:
        self.turns += 1
        if self.turns >= self.last:
            return StepResult(reward=float(self.turns) / 3, done=True)
        return StepResult(observation=(Message("tool", f"heard {len(action)} chars"),))


class Recording:
    """Wraps a client; records ``generate`` (contexts and answers) or ``train_step`` calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.generated: dict[tuple[int, ...], list[np.ndarray]] = {}
        self.trained: list[Any] = []

    def generate(self, prompts, params, request_id=""):  # type: ignore[no-untyped-def]
        groups = self.inner.generate(prompts, params, request_id)
        for prompt, group in zip(prompts, groups, strict=True):
            key = tuple(np.asarray(prompt).tolist())
            self.generated.setdefault(key, []).extend(c.token_ids.copy() for c in group)
        return groups

    def train_step(self, samples):  # type: ignore[no-untyped-def]
        self.trained.extend(samples)
        return self.inner.train_step(samples)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_builtin_model("tiny-qwen3", root=tmp_path_factory.mktemp("models"))


@pytest.fixture(params=["hf", "vllm"])
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def closers() -> Iterator[list[Any]]:
    """Callables run after the test (the vLLM engine's close)."""
    out: list[Any] = []
    yield out
    for close in out:
        close()


def test_learner_trains_exactly_the_generated_and_observation_ids(
    engine_name: str, model_path: Path, tmp_path: Path, closers: list[Any]
) -> None:
    twins = twin_services(model_path, learner_config(algorithm="grpo"), seed=0)
    services = twins.services
    if engine_name == "vllm":
        from hybridflow.services.learner.core import LearnerCore
        from hybridflow.services.rollout.local import LocalRollout
        from hybridflow.services.rollout.vllm_engine import VLLMEngine
        from hybridflow.weights.base import LocalWeightSender, SendPublisher

        engine = VLLMEngine(model_path, max_model_len=256)
        closers.append(engine.close)
        vllm = LocalRollout(engine, "tiny-qwen3")
        publisher = SendPublisher(lambda: list(twins.worker.full_state_dict_items()))
        publisher.attach("local", LocalWeightSender(vllm))
        services.rollouts, services.learner = [vllm], LearnerCore(twins.worker, publisher=publisher)
    rollout, learner = Recording(services.rollouts[0]), Recording(services.learner)
    services.rollouts, services.learner = [rollout], learner
    tokenizer = twins.tokenizer
    chat = ChatTokens(tokenizer)
    prompts = ["1+2", "say hi", "34+5", "ok"]
    records = [
        PromptRecord(
            prompt_text=p,
            prompt_ids=tokenizer.encode(p, add_special_tokens=False),
            data_source="test",
            ground_truth=None,
            index=i,
            task_prompt=p,
        )
        for i, p in enumerate(prompts)
    ]
    config = CoordinatorConfig(
        num_steps=2,
        prompts_per_step=2,
        group_size=2,
        seed=3,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=6),
        multi_turn=MultiTurnConfig(env=ENV, max_turns=3, max_total_tokens=64),
        save_checkpoint=False,
        checkpoint_every=0,
        progress=False,
    )
    job = TrainingJob(config, services, records, tmp_path, needs=learner.schedule_needs())
    job.run()
    assert job.state.step == 2 and len(learner.trained) == 8

    observations = {
        tuple(chat.observation([Message("tool", f"heard {n} chars")], eos).tolist())
        for n in range(0, 64)
        for eos in (True, False)
    }
    multi_turn = 0
    for sample in learner.trained:
        prompt = sample.prompt_ids.tolist()
        response, mask = sample.response_ids.tolist(), sample.loss_mask
        assert mask is not None and mask.size == len(response)
        assert prompt in [chat.opening([Message("user", p)]).tolist() for p in prompts]
        pos, turns = 0, 0
        while pos < len(response):
            context = tuple(prompt + response[:pos])
            assert context in rollout.generated, f"no generation was asked for at {pos}"
            # The policy's run: one of the engine's answers to exactly this context (a turn
            # cut by max_total_tokens is a prefix of it).
            end = pos
            while end < len(response) and mask[end] == 1:
                end += 1
            run = response[pos:end]
            assert any(g.tolist()[: len(run)] == run for g in rollout.generated[context])
            turns += 1
            if end == len(response):
                break
            # The observation's run: the template's ids of a message the env said.
            obs_end = end
            while obs_end < len(response) and mask[obs_end] == 0:
                obs_end += 1
            assert tuple(response[end:obs_end]) in observations
            assert obs_end < len(response), "a trajectory ends on a policy token"
            pos = obs_end
        multi_turn += turns > 1
        assert set(sample.rollout_logprobs[mask == 0].tolist()) <= {0.0}
    assert multi_turn >= 6, "too few episodes had a second turn to check anything"
