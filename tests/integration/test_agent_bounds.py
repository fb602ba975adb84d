"""Agents that misbehave, run by the environment service's agent host against the real
endpoint and engine (in process): an agent that hangs, raises, floods requests, sends
malformed messages or runs past its tokens ends its own episode with a clear reason; a
well-behaved agent's episode beside them is whole; a replica that fails is told apart."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import openai
import pytest

from hybridflow.agents.capture import CaptureLimits
from hybridflow.agents.endpoint import AgentEndpoint, EndpointLimits
from hybridflow.envs.base import Task
from hybridflow.envs.calculator import make_calc_rows
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer
from hybridflow.services.environment.agent_episodes import AgentHost
from hybridflow.services.environment.config import EnvironmentConfig
from hybridflow.services.rollout.engine import HFEngine
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.types import SamplingParams

HERE = "tests.integration.test_agent_bounds"
RELEASE = threading.Event()


def hangs(task: Task, client: openai.OpenAI) -> float:
    RELEASE.wait(300)  # past the short host's agent_timeout_s; let go at the test's end
    return 1.0


def raises(task: Task, client: openai.OpenAI) -> float:
    raise RuntimeError("the agent broke")


def floods(task: Task, client: openai.OpenAI) -> float:
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(10):
        reply = client.chat.completions.create(model="p", messages=messages, max_tokens=2)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "more"},
        ]
    return 1.0


def malformed(task: Task, client: openai.OpenAI) -> dict:
    refused = []
    for bad in ([], [{"role": "wizard", "content": "hi"}], [{"role": "user"}]):
        try:
            client.chat.completions.create(model="p", messages=bad)
        except openai.BadRequestError as exc:
            refused.append(exc.status_code)
    reply = client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": task.prompt}]
    )
    return {"reward": 0.5, "refused": refused, "said": bool(reply.choices[0].message.content)}


def long_context(task: Task, client: openai.OpenAI) -> float:
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(3):
        reply = client.chat.completions.create(model="p", messages=messages)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "x " * 60},
        ]
    return 1.0


def bad_reward(task: Task, client: openai.OpenAI) -> object:
    return "great"


AGENTS = ["hangs", "raises", "floods", "malformed", "long_context", "bad_reward"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    path = ensure_builtin_model("tiny-tools", root=Path(tmp_path_factory.mktemp("models")))
    rollout = LocalRollout(HFEngine(path), "tiny-tools")
    config = EnvironmentConfig(
        envs=[f"{HERE}:{a}" for a in AGENTS] + ["hybridflow.envs.calc_agent:calc_agent"],
        agent_timeout_s=120.0,  # generous: a busy machine never ends a good agent's episode
        max_episodes=8,
    )
    limits = EndpointLimits(
        max_episodes=8,
        episode_wall_s=120.0,
        capture=CaptureLimits(max_requests=4, max_response_tokens=120),
    )
    endpoint = AgentEndpoint(load_tokenizer(path), "tiny-tools", limits)
    endpoint.start()
    yield config, endpoint, rollout
    RELEASE.set()  # the hung agent's thread lets go before the endpoint stops
    endpoint.stop()


@pytest.fixture(scope="module")
def host(parts):
    config, endpoint, rollout = parts
    return AgentHost(config, endpoint, lambda address: rollout)


@pytest.fixture(scope="module")
def short_host(parts):
    """The same endpoint with a short agent deadline: only the agent that hangs meets it."""
    config, endpoint, rollout = parts
    return AgentHost(
        dataclasses.replace(config, agent_timeout_s=2.0), endpoint, lambda address: rollout
    )


def task() -> Task:
    row = make_calc_rows(1, seed=0)[0]
    return Task(row["prompt"][-1]["content"], row["reward_model"]["ground_truth"], "calc")


def run(host: AgentHost, agent: str, episode_id: str):
    return host.run(
        episode_id, agent, task(), "replica:1", SamplingParams(max_new_tokens=16, seed=1)
    )


@pytest.mark.parametrize(
    ("agent", "reason"),
    [
        ("raises", "the agent raised RuntimeError: the agent broke"),
        ("floods", "max_requests=4"),
        ("long_context", "max_response_tokens=120"),
        ("bad_reward", "a float reward"),
    ],
)
def test_a_misbehaving_agent_fails_its_episode_with_the_reason(host, agent, reason):
    result = run(host, f"{HERE}:{agent}", f"ep-{agent}")
    assert reason in result.error and result.reward == 0.0
    assert host.endpoint.num_open == 0  # its episode closed


def test_malformed_requests_are_refused_and_the_episode_goes_on(host):
    result = run(host, f"{HERE}:malformed", "ep-malformed")
    assert result.error == "" and result.reward == 0.5
    assert result.info == {"refused": [400, 400, 400], "said": True}
    assert result.captured.num_requests == 1 and len(result.captured.trajectories) == 1


def test_a_hung_agent_is_given_up_at_its_deadline_and_another_episode_is_whole(host, short_host):
    done: dict = {}
    worker = threading.Thread(
        target=lambda: done.update(ok=run(host, "hybridflow.envs.calc_agent:calc_agent", "ep-ok"))
    )
    worker.start()
    hung = run(short_host, f"{HERE}:hangs", "ep-hangs")
    worker.join(300)
    assert "did not return within environment.agent_timeout_s=2s" in hung.error
    ok = done["ok"]
    assert ok.error == "" and ok.captured.trajectories and ok.captured.num_requests >= 1
    with pytest.raises(ValueError, match="not in environment.envs"):
        run(host, "somewhere:else", "ep-else")


def test_a_replica_failure_is_not_the_agents(host):
    class Broken:
        def generate(self, prompts, params, request_id=""):
            raise ConnectionError("replica gone")

    broken = AgentHost(host.config, host.endpoint, lambda address: Broken())
    result = broken.run(
        "ep-broken",
        "hybridflow.envs.calc_agent:calc_agent",
        task(),
        "replica:9",
        SamplingParams(max_new_tokens=8),
    )
    assert "replica:9" in result.replica_error and "replica gone" in result.replica_error
