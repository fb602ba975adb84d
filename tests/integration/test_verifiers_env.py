"""verifiers (v1) tasksets played through the real agent endpoint by the environment service's
agent host: the rows of a ``verifiers:`` dataset, the taskset's tools served from its
``vf.Toolset``, the reward from the task's own ``@vf.reward``.

A scripted policy (a rollout client that answers fixed texts; the policy is not what is under
test here) makes the verdicts exact: a right answer after a tool call scores 1, a wrong one 0,
the tool's result is what the toolset computes. The built-in model on the real engine then
plays episodes whole."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from hybridflow.agents.endpoint import AgentEndpoint
from hybridflow.agents.verifiers_env import AGENT_PATH
from hybridflow.data.verifiers_tasks import verifiers_rows
from hybridflow.envs.base import Task
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer
from hybridflow.services.environment.agent_episodes import AgentHost
from hybridflow.services.environment.config import EnvironmentConfig
from hybridflow.services.rollout.engine import HFEngine
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.types import Completion, SamplingParams

CALC = "verifiers:hybridflow.envs.verifiers_examples:CalcTaskset?num_tasks=8&seed=3"
ARITH = "verifiers:hybridflow.envs.verifiers_examples:ArithTaskset?num_tasks=8"


class Scripted:
    """A rollout client whose completions are the next of ``texts`` (then EOS); it records
    the contexts it was asked to continue."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.contexts = tokenizer, list(texts), []

    def generate(self, prompts, params, request_id=""):
        self.contexts.append(self.tokenizer.decode(prompts[0].tolist()))
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return [[Completion(np.array(ids), np.zeros(len(ids)), "stop", 0)]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = ensure_builtin_model("tiny-tools", root=Path(tmp_path_factory.mktemp("models")))
    tokenizer = load_tokenizer(path)
    endpoint = AgentEndpoint(tokenizer, "tiny-tools")
    endpoint.start()
    yield path, tokenizer, endpoint
    endpoint.stop()


def host(endpoint, rollout) -> AgentHost:
    config = EnvironmentConfig(envs=[AGENT_PATH], agent_timeout_s=120.0, max_episodes=4)
    return AgentHost(config, endpoint, lambda address: rollout)


def as_task(row: dict) -> Task:
    return Task(row["prompt"][-1]["content"], None, row["data_source"], row["extra_info"])


def tool_call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


@pytest.mark.parametrize("right", [True, False])
def test_the_tasks_own_reward_scores_the_episode_and_its_tool_runs(model, right):
    path, tokenizer, endpoint = model
    row = verifiers_rows(CALC, 1)[0]
    question = row["prompt"][-1]["content"]
    expression = re.sub(r"^What is (.*)\?$", r"\1", question)
    answer = row["extra_info"]["verifiers"]["data"]["answer"]
    said = answer if right else str(int(answer) + 1)
    policy = Scripted(tokenizer, [tool_call(expression), f"<answer>{said}</answer>"])
    run = host(endpoint, policy).run(
        f"vf-{right}", AGENT_PATH, as_task(row), "replica:1", SamplingParams(max_new_tokens=64)
    )
    assert run.error == "", run.error
    assert run.reward == float(right)
    assert run.info["rewards"] == {"answered": float(right)}
    assert run.info["metrics"] == {"tool_calls": 1.0} and run.info["tool_calls"] == 1
    # the second request carried the toolset's result for the expression, as a tool message
    assert len(policy.contexts) == 2 and answer in policy.contexts[1].split(question)[-1]
    assert run.captured is not None and run.captured.num_requests == 2


def test_a_wrong_tool_call_is_answered_with_its_error_and_the_episode_goes_on(model):
    path, tokenizer, endpoint = model
    row = verifiers_rows(CALC, 1)[0]
    bad = '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
    policy = Scripted(tokenizer, [bad, "<answer>0</answer>"])
    run = host(endpoint, policy).run(
        "vf-bad", AGENT_PATH, as_task(row), "replica:1", SamplingParams(max_new_tokens=64)
    )
    assert run.error == "" and run.reward == 0.0
    assert run.info["tool_errors"] == 1 and "Field required" in policy.contexts[1]


def test_a_single_turn_taskset_is_one_request_scored_by_exact_match(model):
    path, tokenizer, endpoint = model
    rows = verifiers_rows(ARITH, 2)
    answers = [r["extra_info"]["verifiers"]["data"]["answer"] for r in rows]
    policy = Scripted(tokenizer, [answers[0], "x"])
    runner = host(endpoint, policy)
    runs = [
        runner.run(f"vf-a{i}", AGENT_PATH, as_task(r), "replica:1", SamplingParams())
        for i, r in enumerate(rows)
    ]
    assert [r.reward for r in runs] == [1.0, 0.0]
    assert all(r.captured is not None and r.captured.num_requests == 1 for r in runs)


def test_the_built_in_model_plays_calc_episodes_whole(model):
    path, tokenizer, endpoint = model
    rollout = LocalRollout(HFEngine(path), "tiny-tools")
    runner = host(endpoint, rollout)
    rows = verifiers_rows(CALC, 4)
    runs = [
        runner.run(f"vf-m{i}", AGENT_PATH, as_task(r), "replica:1",
                   SamplingParams(max_new_tokens=48, seed=i))
        for i, r in enumerate(rows)
    ]  # fmt: skip
    for run in runs:
        assert run.error == "" and run.captured is not None and run.captured.trajectories
        assert run.reward in (0.0, 1.0) and run.info["rewards"] == {"answered": run.reward}


def test_a_row_that_is_not_a_verifiers_task_fails_its_episode_naming_why(model):
    path, tokenizer, endpoint = model
    run = host(endpoint, Scripted(tokenizer, [])).run(
        "vf-none", AGENT_PATH, Task("1+1=", "2", "arith"), "replica:1", SamplingParams()
    )
    assert "no 'verifiers' task" in run.error and run.reward == 0.0
