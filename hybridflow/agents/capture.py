"""One agent episode's trajectory, assembled from token ids as its chat requests arrive: the
core of the OpenAI-compatible endpoint (no HTTP, no grpc, no engine here).

An agent sends the whole conversation with every request. What trains must be what the
engine generated, id for id, plus the chat template's ids for what the agent added, never a
re-tokenisation of returned text (a tool call re-rendered by the template is not the ids the
policy sampled). So the episode keeps its context as ids and, per request:

- the first request's messages are rendered with the template (and its generation prompt)
  and tokenised once: the segment's prompt;
- a later request must *extend* the conversation the context holds: the messages before the
  new ones equal, message for message, the history so far, whose assistant messages are
  the ones this endpoint returned (content and tool calls as sent); the new messages are the
  agent's (tool results, user turns), none of them an assistant's; and the template renders
  the history as a prefix of the whole (``render(history)`` starts ``render(messages)``).
  Then the new messages' ids are the template's text after the last assistant turn
  (``ChatTokens.observation``), appended with loss mask 0, and the engine continues from
  the exact ids;
- a request that does not extend it (the agent edited or dropped history, rewrote an
  assistant message, or the template renders earlier turns differently once more follow,
  as templates that drop reasoning do) **breaks** the segment. The rule (``on_break``):
  ``split`` (the default) closes the segment and starts a new one whose prompt is the
  request rendered whole, so each segment trains on the context the policy really saw;
  ``refuse`` ends the episode with an error naming the check. Breaks are counted with the
  check that failed.

Each segment becomes one trajectory (``Completion`` with its own ``prompt_ids``, loss mask 1
exactly on generated ids, their log-probs and per-token versions, 0 / -1 on template ids).
Bounds per episode: requests, and response tokens over all segments.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hybridflow.arrays import TokenArray
from hybridflow.envs.base import Message
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.types import Completion

BreakRule = Literal["split", "refuse"]
Render = Callable[[Sequence[dict[str, Any]], bool], str]
"""(messages as chat dicts, with the generation prompt) -> the template's text."""

BREAK_CHECKS = (
    "history_changed",
    "assistant_in_new_messages",
    "template_not_prefix",
    "text_changed",
)
"""Why a request broke its segment (``EpisodeCapture.breaks``)."""


class CaptureRefused(ValueError):
    """The request was refused: a bound was reached, or it broke its segment under
    ``on_break: refuse``. The episode ends with this error."""


@dataclass(frozen=True)
class CaptureLimits:
    """One episode's bounds: its requests and its response tokens."""

    max_requests: int = 64
    """Chat requests one episode may make."""
    max_response_tokens: int = 4096
    """Tokens after the prompts (generated and template) over all segments."""


@dataclass
class _Segment:
    prompt_ids: TokenArray
    ids: list[np.ndarray] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    versions: list[np.ndarray] = field(default_factory=list)
    mask: list[np.ndarray] = field(default_factory=list)
    finish: str = "length"

    def context(self) -> TokenArray:
        return np.concatenate([self.prompt_ids, *self.ids]).astype(np.int32, copy=False)

    @property
    def num_response_tokens(self) -> int:
        return sum(a.size for a in self.ids)

    def trajectory(self) -> Completion:
        mask = np.concatenate(self.mask)
        versions = np.concatenate(self.versions)
        return Completion(
            token_ids=np.concatenate(self.ids),
            logprobs=np.concatenate(self.logprobs),
            finish_reason="stop" if self.finish == "stop" else "length",
            policy_version=int(versions[mask == 1].min()),
            token_versions=versions,
            loss_mask=mask,
            prompt_ids=self.prompt_ids,
        )


def normalized(message: dict[str, Any]) -> str:
    """A chat message as compared for "the same message": role, text content (parts joined),
    tool calls (id, name, arguments text), tool_call_id and name; anything else ignored."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    calls = [
        {
            "id": c.get("id"),
            "name": (c.get("function") or {}).get("name"),
            "arguments": _arguments_text((c.get("function") or {}).get("arguments")),
        }
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return json.dumps(
        {
            "role": message.get("role"),
            "content": content or "",
            "tool_calls": calls,
            "tool_call_id": message.get("tool_call_id"),
            "name": message.get("name"),
        },
        sort_keys=True,
    )


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), sort_keys=True)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


class EpisodeCapture:
    """One episode's segments (module docstring). Not thread-safe: the endpoint serves one
    request of an episode at a time."""

    def __init__(
        self,
        chat: ChatTokens,
        render: Render,
        limits: CaptureLimits = CaptureLimits(),
        on_break: BreakRule = "split",
    ) -> None:
        self.chat = chat
        self.render = render
        self.limits = limits
        self.on_break = on_break
        self.segments: list[_Segment] = []
        self.history: list[dict[str, Any]] = []
        """The conversation the current segment's context holds, as chat dicts."""
        self._history_keys: list[str] = []
        self._text: str | None = None
        """``/v1/completions``: the text the current segment's context holds."""
        self._ended_with_eos = True
        self.num_requests = 0
        self.breaks: Counter[str] = Counter()

    # ------------------------------------------------------------------ a request
    def context_for(self, messages: Sequence[dict[str, Any]]) -> TokenArray:
        """The ids the engine generates this request from (``messages``: the request's whole
        conversation). ``CaptureRefused`` past a bound or on a break under ``refuse``."""
        if not messages:
            raise CaptureRefused("messages: the request has no messages")
        self._count_request()
        messages = list(messages)
        if not self.segments:
            return self._new_segment(messages)
        broken = self._break_check(messages)
        if broken is None:
            new = messages[len(self.history) :]
            ids = self.chat.observation(
                [Message(m["role"], _text(m)) for m in new], self._ended_with_eos
            )
            self._append_template(ids)
            self._remember(new)
            return self.segments[-1].context()
        self._broken(broken)
        return self._new_segment(messages)

    def context_for_text(self, prompt: str) -> TokenArray:
        """``/v1/completions``: the ids the engine generates from for the prompt text. It
        extends the segment when it starts with the segment's text (its prompt, each
        completion as returned, what the agent added since): the added text is tokenised
        alone and appended (mask 0); otherwise it breaks (``text_changed``)."""
        if not prompt:
            raise CaptureRefused("prompt: the request has no prompt")
        self._count_request()
        if self.segments and self._text is not None:
            if len(prompt) > len(self._text) and prompt.startswith(self._text):
                ids = self.chat.encode(prompt[len(self._text) :])
                self._append_template(ids)
                self._text = prompt
                return self.segments[-1].context()
        if self.segments:
            self._broken("text_changed")
        ids = self.chat.encode(prompt)
        if ids.size == 0:
            raise CaptureRefused("the prompt encodes to zero tokens")
        self.segments.append(_Segment(ids))
        self.history, self._history_keys, self._text = [], [], prompt
        self._ended_with_eos = True
        return ids

    def add_generated(
        self, completion: Completion, returned: dict[str, Any] | str, take: int
    ) -> None:
        """The engine's answer to the request just begun: its first ``take`` ids (the rest
        past the episode's token bound are dropped), with their log-probs and versions;
        ``returned`` is what the endpoint sends back (the assistant message, or the text of
        a ``/v1/completions`` answer): what the next request must hold."""
        segment = self.segments[-1]
        ids = completion.token_ids[:take]
        versions = (
            completion.token_versions[:take]
            if completion.token_versions is not None
            else np.full(take, completion.policy_version, dtype=np.int32)
        )
        segment.ids.append(ids)
        segment.logprobs.append(completion.logprobs[:take])
        segment.versions.append(versions)
        segment.mask.append(np.ones(take, dtype=np.uint8))
        self._ended_with_eos = (
            completion.finish_reason == "stop" and take == completion.token_ids.size
        )
        segment.finish = "stop" if self._ended_with_eos else "length"
        if isinstance(returned, str):
            self._text = (self._text or "") + returned
        else:
            self._remember([returned])

    def room(self) -> int:
        """Response tokens the episode may still add."""
        return self.limits.max_response_tokens - sum(s.num_response_tokens for s in self.segments)

    # ------------------------------------------------------------------ the result
    def trajectories(self) -> list[Completion]:
        """One per segment that generated anything, in order."""
        return [s.trajectory() for s in self.segments if any(m.any() for m in s.mask)]

    # ------------------------------------------------------------------ inside
    def _new_segment(self, messages: list[dict[str, Any]]) -> TokenArray:
        text = self.render(messages, True)
        prompt = self.chat.encode(text)  # as the observations are tokenised
        if prompt.size == 0:
            raise CaptureRefused("the request's messages render to zero tokens")
        self.segments.append(_Segment(prompt))
        self.history, self._history_keys, self._text = [], [], None
        self._ended_with_eos = True
        self._remember(messages)
        return prompt

    def _break_check(self, messages: list[dict[str, Any]]) -> str | None:
        """None when ``messages`` extends the history, else the check that failed."""
        n = len(self.history)
        if len(messages) <= n or [normalized(m) for m in messages[:n]] != self._history_keys:
            return "history_changed"
        if any(m.get("role") == "assistant" for m in messages[n:]):
            return "assistant_in_new_messages"
        if not self.render(messages, True).startswith(self.render(self.history, False)):
            return "template_not_prefix"
        return None

    def _count_request(self) -> None:
        if self.num_requests >= self.limits.max_requests:
            raise CaptureRefused(
                f"the episode made {self.num_requests} requests, its bound is "
                f"max_requests={self.limits.max_requests}"
            )
        self.num_requests += 1

    def _append_template(self, ids: TokenArray) -> None:
        """Ids of what the agent added (mask 0, log-prob 0, version -1)."""
        self._check_room(ids.size)
        segment = self.segments[-1]
        segment.ids.append(ids)
        segment.logprobs.append(np.zeros(ids.size, dtype=np.float32))
        segment.versions.append(np.full(ids.size, -1, dtype=np.int32))
        segment.mask.append(np.zeros(ids.size, dtype=np.uint8))

    def _broken(self, check: str) -> None:
        """Counts a break; ``CaptureRefused`` under ``on_break: refuse``."""
        self.breaks[check] += 1
        if self.on_break == "refuse":
            raise CaptureRefused(
                f"the request does not extend the episode's conversation ({check}): "
                "on_break is refuse"
            )

    def _remember(self, messages: Sequence[dict[str, Any]]) -> None:
        self.history.extend(dict(m) for m in messages)
        self._history_keys.extend(normalized(m) for m in messages)

    def _check_room(self, num: int) -> None:
        if num + 1 > self.room():  # the template's ids and at least one generated token
            raise CaptureRefused(
                f"the episode's response tokens would pass max_response_tokens="
                f"{self.limits.max_response_tokens}"
            )


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return "" if content is None else str(content)
