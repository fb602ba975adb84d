"""The OpenAI chat API's wire format, as the agent endpoint speaks it: requests checked and
bounded into plain values, answers built from what the engine generated.

``/v1/completions`` takes one string ``prompt`` with the same ``max_tokens``, ``stop``,
``seed`` and ``n``. A chat request's ``messages`` (system, user, assistant with ``tool_calls``, tool with
``tool_call_id``), ``tools`` (passed to the chat template), ``temperature``, ``top_p``,
``max_tokens`` / ``max_completion_tokens``, ``stop``, ``seed`` and ``n`` (1: an episode is
one line of conversation; its group's other samples are episodes of their own) are read;
``stream`` is refused (the clients this endpoint serves do not need it). Anything else the
clients send (``model``, ``user``, ``logprobs``...) is accepted and ignored. The answer's
assistant message carries the generated text with its ``<tool_call>`` blocks (Hermes /
Qwen format, ``envs.tool_calls``) taken out as OpenAI ``tool_calls``, and
``finish_reason`` ``tool_calls``, ``stop`` or ``length``.

This module knows nothing of sockets, engines or episodes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from hybridflow.envs.tool_calls import OPEN_TAG, ToolCall, parse_tool_calls

ROLES = ("system", "user", "assistant", "tool")


class BadRequest(ValueError):
    """The request is malformed or out of bounds: answered 400 with the message."""


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request's values."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    temperature: float
    top_p: float
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None


@dataclass(frozen=True)
class Bounds:
    """What one chat request may hold."""

    max_messages: int = 256
    max_chars: int = 256 * 1024
    """Characters of all message contents and tool definitions together."""
    max_tokens: int = 4096
    """Largest ``max_tokens`` a request may ask."""


def parse_chat(body: Any, bounds: Bounds) -> ChatRequest:
    """A chat request's values, checked; ``BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("stream: streaming is not supported by this endpoint")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest(f"n: an episode's request takes n=1, got {n!r}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list is required")
    if len(messages) > bounds.max_messages:
        raise BadRequest(f"messages: {len(messages)} messages, the bound is {bounds.max_messages}")
    size = 0
    for i, message in enumerate(messages):
        size += _check_message(message, i)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise BadRequest("tools: a list of tool objects is required")
        size += len(json.dumps(tools))
    if size > bounds.max_chars:
        raise BadRequest(
            f"messages and tools hold {size} characters, the bound is {bounds.max_chars}"
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        not _is_int(max_tokens) or not 1 <= max_tokens <= bounds.max_tokens
    ):
        raise BadRequest(f"max_tokens: an integer in 1..{bounds.max_tokens}, got {max_tokens!r}")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise BadRequest("stop: a string or up to 4 non-empty strings")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise BadRequest(f"seed: an integer, got {seed!r}")
    return ChatRequest(
        messages=messages,
        tools=tools,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        max_tokens=max_tokens,
        stop=stops,
        seed=seed,
    )


@dataclass(frozen=True)
class CompletionRequest:
    """A checked ``/v1/completions`` request's values."""

    prompt: str
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None


def parse_completion(body: Any, bounds: Bounds) -> CompletionRequest:
    """A completions request's values, checked (one string prompt, n=1, no stream);
    ``BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("stream: streaming is not supported by this endpoint")
    if body.get("n", 1) != 1:
        raise BadRequest(f"n: an episode's request takes n=1, got {body.get('n')!r}")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt: one non-empty string is required")
    if len(prompt) > bounds.max_chars:
        raise BadRequest(f"prompt: {len(prompt)} characters, the bound is {bounds.max_chars}")
    chat = parse_chat({**body, "messages": [{"role": "user", "content": "x"}]}, bounds)
    return CompletionRequest(prompt, chat.max_tokens, chat.stop, chat.seed)


def text_completion(
    request_id: str,
    model: str,
    text: str,
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A ``text_completion`` object with one choice."""
    choice = {"text": text, "finish_reason": finish}
    return _answer("text_completion", request_id, model, choice, prompt_tokens, completion_tokens)


def assistant_message(text: str) -> tuple[dict[str, Any], bool]:
    """The assistant message an answer carries, and whether it calls tools: the text with
    its well-formed tool-call blocks moved to ``tool_calls`` (a malformed block stays in
    the text, for the agent to see)."""
    parsed = parse_tool_calls(text)
    if not parsed.calls:
        return {"role": "assistant", "content": text}, False
    content = text[: text.find(OPEN_TAG)].strip() or None
    calls = [_tool_call(c, i) for i, c in enumerate(parsed.calls)]
    return {"role": "assistant", "content": content, "tool_calls": calls}, True


def chat_completion(
    request_id: str,
    model: str,
    message: dict[str, Any],
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice."""
    choice = {"message": message, "finish_reason": finish}
    return _answer("chat.completion", request_id, model, choice, prompt_tokens, completion_tokens)


def _answer(
    kind: str,
    request_id: str,
    model: str,
    choice: dict[str, Any],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, **choice, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """The error object the OpenAI clients read."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def models(model: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": 0, "owned_by": "hybridflow"}],
    }


def _tool_call(call: ToolCall, index: int) -> dict[str, Any]:
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def _check_message(message: Any, index: int) -> int:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where}: an object is required")
    role = message.get("role")
    if role not in ROLES:
        raise BadRequest(f"{where}.role: one of {list(ROLES)}, got {role!r}")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise BadRequest(f"{where}.content: only text parts are supported")
        size = sum(len(str(p.get("text", ""))) for p in content)
    elif content is None:
        if not (role == "assistant" and message.get("tool_calls")):
            raise BadRequest(
                f"{where}.content: required (null only for an assistant calling tools)"
            )
        size = 0
    elif isinstance(content, str):
        size = len(content)
    else:
        raise BadRequest(f"{where}.content: a string or a list of text parts")
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise BadRequest(f"{where}.tool_calls: a list, on an assistant message only")
        size += len(json.dumps(calls))
    return size


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(
    body: dict[str, Any], key: str, default: float, low: float, high: float, low_open: bool = False
) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadRequest(f"{key}: a number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        raise BadRequest(f"{key}: in {'(' if low_open else '['}{low}, {high}], got {value}")
    return float(value)
