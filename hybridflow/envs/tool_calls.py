"""Tool calls in the Qwen / Hermes format, parsed from a policy turn's decoded text.

A call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; ``arguments`` may
also be a JSON string holding the object (some models emit that). A tool's answer goes back
as ``Message("tool", content)``: the role Qwen's chat template renders as
``<tool_response>...</tool_response>`` inside a user turn (consecutive tool messages share
that turn).

Parsing never raises on what the policy wrote: every malformed block (bad JSON, no name,
arguments that are not an object, an unclosed tag) becomes a ``ToolCallError`` whose message
the environment can send back as an observation. Bounds: the text a turn may hold
(``max_text_chars``; longer text is not parsed at all) and the calls one turn may make
(``max_calls``; the blocks after them are refused together, with one error), so what the
environment answers is bounded too.

This module knows nothing about what the tools do, tokens or chat templates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hybridflow.envs.base import Message

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
DEFAULT_MAX_CALLS = 4
"""Tool call blocks one turn may make; the blocks after these get one error together."""
DEFAULT_MAX_TEXT_CHARS = 16_384
"""A turn longer than this (characters) is refused unparsed: a tiny policy that rambles
should not cost the environment a scan of megabytes."""


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call. ``index``: its block's 0-based position in the turn."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    index: int = 0


@dataclass(frozen=True)
class ToolCallError:
    """One malformed or refused block. ``index``: its block's 0-based position in the turn
    (-1 for an error about the whole turn)."""

    message: str
    index: int = 0


@dataclass(frozen=True)
class ParsedToolCalls:
    """The calls of one turn and the errors of its malformed blocks."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()

    def in_order(self) -> list[ToolCall | ToolCallError]:
        """Calls and errors interleaved in the order their blocks appear in the turn, so an
        environment answers them in that order."""
        items: list[ToolCall | ToolCallError] = [*self.calls, *self.errors]
        return sorted(items, key=lambda item: item.index)


def parse_tool_calls(
    text: str,
    max_calls: int = DEFAULT_MAX_CALLS,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> ParsedToolCalls:
    """Every ``<tool_call>`` block of ``text``, parsed; text outside the blocks is ignored."""
    if max_calls < 1:
        raise ValueError(f"max_calls must be >= 1, got {max_calls}")
    if max_text_chars < 1:
        raise ValueError(f"max_text_chars must be >= 1, got {max_text_chars}")
    if len(text) > max_text_chars:
        error = (
            f"the turn is {len(text)} characters, over the limit of {max_text_chars}; not parsed"
        )
        return ParsedToolCalls(errors=(ToolCallError(error, -1),))
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    index = 0
    start = text.find(OPEN_TAG)
    while start >= 0 and index < max_calls:
        body_start = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        next_open = text.find(OPEN_TAG, body_start)
        if end < 0 or 0 <= next_open < end:
            errors.append(ToolCallError(f"tool call {index}: {OPEN_TAG} has no {CLOSE_TAG}", index))
            start, index = next_open, index + 1
            continue
        parsed = _parse_body(text[body_start:end], index)
        if isinstance(parsed, ToolCall):
            calls.append(parsed)
        else:
            errors.append(parsed)
        start, index = text.find(OPEN_TAG, end + len(CLOSE_TAG)), index + 1
    if start >= 0:  # blocks past the bound: one error for all, so the answer stays bounded
        num_refused = text.count(OPEN_TAG, start)
        errors.append(
            ToolCallError(
                f"{num_refused} more tool call(s) refused: a turn may make at most {max_calls}",
                index,
            )
        )
    return ParsedToolCalls(tuple(calls), tuple(errors))


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a policy writes to call ``name`` (what demonstrations teach)."""
    return f"{OPEN_TAG}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE_TAG}"


def tool_message(content: str) -> Message:
    """A tool's answer (result or error) as the observation message."""
    return Message("tool", content)


def _parse_body(body: str, index: int) -> ToolCall | ToolCallError:
    where = f"tool call {index}"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCallError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})", index)
    except RecursionError:
        return ToolCallError(f"{where}: invalid JSON: nested too deeply", index)
    if not isinstance(value, dict):
        return ToolCallError(f"{where}: expected a JSON object, got {type(value).__name__}", index)
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(
            f'{where}: field "name" must be a non-empty string, got {name!r}', index
        )
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # arguments as a JSON string, as some models emit
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return ToolCallError(f'{where}: field "arguments" is a string but not JSON', index)
    if not isinstance(arguments, dict):
        return ToolCallError(
            f'{where}: field "arguments" must be an object, got {type(arguments).__name__}', index
        )
    return ToolCall(name, arguments, index)
