"""The agent endpoint with the real ``openai`` client: a multi-turn, tool-using episode of the
calculator task played by ``builtin:tiny-tools`` on the real engine; every trained id is what
the engine generated or what the chat template renders for the agent's messages, id for id,
the loss mask exactly on the generated ids. The same check fails on a re-tokenised path (a
server that renders the agent's messages with the template and tokenises them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openai
import pytest

from hybridflow.agents.endpoint import AgentEndpoint
from hybridflow.envs.calculator import make_calc_rows
from hybridflow.envs.safe_arith import CalcError, evaluate
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer
from hybridflow.services.rollout.engine import HFEngine
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.types import SamplingParams

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = ensure_builtin_model("tiny-tools", root=Path(tmp_path_factory.mktemp("models")))
    tokenizer = load_tokenizer(path)
    rollout = LocalRollout(HFEngine(path), "tiny-tools")
    generated: list[tuple[list[int], list[int]]] = []

    def generate(context, params):
        ((completion,),) = rollout.generate([context], params)
        generated.append((context.tolist(), completion.token_ids.tolist()))
        return completion

    endpoint = AgentEndpoint(tokenizer, "tiny-tools")
    endpoint.start()
    yield endpoint, tokenizer, generate, generated
    endpoint.stop()


def play(client: openai.OpenAI, task: dict) -> list[dict]:
    """The agent: call the model, run its calculator calls, until it answers (4 turns)."""
    messages = [m for m in task["prompt"]]
    for _ in range(4):
        reply = client.chat.completions.create(
            model="tiny-tools", messages=messages, tools=[CALCULATOR]
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                result = str(evaluate(json.loads(call.function.arguments)["expression"]))
            except (CalcError, KeyError, json.JSONDecodeError) as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages


def test_every_trained_id_is_generated_or_rendered_and_a_retokenised_path_is_not(served):
    endpoint, tokenizer, generate, generated = served
    rows = make_calc_rows(24, seed=0)
    played = None
    for i, row in enumerate(rows):  # the first episode whose policy calls the tool
        generated.clear()
        base_url, key = endpoint.open(
            f"ep-{i}", generate, SamplingParams(max_new_tokens=48, seed=i)
        )
        messages = play(openai.OpenAI(base_url=base_url, api_key=key, max_retries=0), row)
        result = endpoint.close(f"ep-{i}")
        if any(m.get("tool_calls") for m in messages) and len(generated) >= 2:
            played = (messages, result, list(generated))
            break
    assert played is not None, "no episode of 24 called the calculator"
    messages, result, turns = played
    assert result.error is None and result.breaks == {} and result.num_requests == len(turns)
    (trajectory,) = result.trajectories
    ids, mask = trajectory.token_ids.tolist(), trajectory.loss_mask.tolist()
    prompt = trajectory.prompt_ids.tolist()

    # The prompt is the template's rendering of the opening (system, user) with the tools.
    opening = tokenizer.apply_chat_template(
        messages[:2], tools=[CALCULATOR], tokenize=False, add_generation_prompt=True
    )
    assert prompt == tokenizer.encode(opening, add_special_tokens=False)
    # Each request's context was exactly the trajectory so far; each turn's ids are the
    # engine's, id for id, and the mask is 1 exactly on them.
    position = 0
    for context, sampled in turns:
        observation = len(context) - len(prompt) - position  # the agent's messages' ids
        assert context == prompt + ids[: position + observation]
        assert mask[position : position + observation] == [0] * observation
        position += observation
        assert ids[position : position + len(sampled)] == sampled
        assert mask[position : position + len(sampled)] == [1] * len(sampled)
        position += len(sampled)
    assert position == len(ids)
    # The observations are the template's ids for the agent's tool messages.
    for (context, _), (next_context, _) in zip(turns, turns[1:]):
        between = next_context[len(context) :]
        text = tokenizer.decode(between)
        assert "<|im_start|>tool" in text and between[-1] != tokenizer.eos_token_id
    # Log-probs and versions only on generated ids.
    lp, versions = trajectory.logprobs, trajectory.token_versions
    assert np.all(lp[np.asarray(mask) == 0] == 0) and np.all(versions[np.asarray(mask) == 0] == -1)
    assert np.all(lp[np.asarray(mask) == 1] < 0)

    # A re-tokenised path: render the agent's conversation as a plain server would and
    # tokenise it. It does not give the ids the engine generated.
    as_sent = [{"content": "", **{k: v for k, v in m.items() if v is not None}} for m in messages]
    naive = tokenizer.encode(
        tokenizer.apply_chat_template(as_sent, tools=[CALCULATOR], tokenize=False),
        add_special_tokens=False,
    )
    assert naive[: len(prompt)] == prompt
    assert naive[len(prompt) :] != ids, "the re-tokenised path matched the engine's ids"
    first_turn = turns[0][1]
    assert naive[len(prompt) : len(prompt) + len(first_turn)] != first_turn


def test_text_completions_extend_their_text_token_exactly(served):
    endpoint, tokenizer, generate, generated = served
    generated.clear()
    base_url, key = endpoint.open("text-1", generate, SamplingParams(max_new_tokens=8, seed=3))
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    first = client.completions.create(model="tiny-tools", prompt="What is 2 + 2?")
    prompt = "What is 2 + 2?" + first.choices[0].text + "\nAnd 3 + 3?"
    client.completions.create(model="tiny-tools", prompt=prompt)
    client.completions.create(model="tiny-tools", prompt="Something else")  # breaks
    result = endpoint.close("text-1")
    assert result.breaks == {"text_changed": 1} and len(result.trajectories) == 2
    first_segment = result.trajectories[0]
    ids, mask = first_segment.token_ids.tolist(), first_segment.loss_mask.tolist()
    (context_1, sampled_1), (context_2, sampled_2), _ = generated
    added = tokenizer.encode("\nAnd 3 + 3?", add_special_tokens=False)
    assert context_1 == tokenizer.encode("What is 2 + 2?", add_special_tokens=False)
    assert ids == [*sampled_1, *added, *sampled_2]  # the engine's ids, the agent's text's
    assert mask == [1] * len(sampled_1) + [0] * len(added) + [1] * len(sampled_2)
    assert context_2 == context_1 + sampled_1 + added
