"""parse_tool_calls: good calls, several per turn, every malformed variant, the bounds."""

from __future__ import annotations

import pytest

from hybridflow.envs.base import Message
from hybridflow.envs.tool_calls import (
    ToolCall,
    ToolCallError,
    format_tool_call,
    parse_tool_calls,
    tool_message,
)


def test_one_call_with_text_around_it() -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.calls == (ToolCall("calc", {"x": 1}, 0),)
    assert parsed.errors == ()


def test_several_calls_keep_their_order() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {"y": [1, 2]}}</tool_call>'
    )
    assert parse_tool_calls(text).calls == (ToolCall("a", {}, 0), ToolCall("b", {"y": [1, 2]}, 1))


def test_arguments_as_a_json_string_are_decoded() -> None:
    text = '<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"2*3\\"}"}</tool_call>'
    assert parse_tool_calls(text).calls == (ToolCall("calc", {"expression": "2*3"}),)


def test_missing_arguments_mean_no_arguments() -> None:
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>').calls == (ToolCall("now"),)


def test_no_call_at_all() -> None:
    parsed = parse_tool_calls("The answer is 42.")
    assert parsed.calls == () and parsed.errors == () and parsed.in_order() == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"name": "calc", "arguments": {', "tool call 0: invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"arguments": {}}', 'field "name" must be a non-empty string, got None'),
        ('{"name": "", "arguments": {}}', 'field "name" must be a non-empty string'),
        ('{"name": 3, "arguments": {}}', 'field "name" must be a non-empty string, got 3'),
        ('{"name": "calc", "arguments": [1]}', 'field "arguments" must be an object, got list'),
        ('{"name": "calc", "arguments": "[1]"}', 'field "arguments" must be an object, got list'),
        ('{"name": "calc", "arguments": "{nope"}', 'field "arguments" is a string but not JSON'),
        ("[" * 5000 + "]" * 5000, "invalid JSON: nested too deeply"),
    ],
)
def test_a_malformed_block_is_an_error_naming_what_is_wrong(body: str, says: str) -> None:
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.calls == ()
    assert len(parsed.errors) == 1
    assert says in parsed.errors[0].message


def test_an_unclosed_tag_is_an_error_and_later_blocks_still_parse() -> None:
    text = '<tool_call>{"name": "a"} <tool_call>{"name": "b"}</tool_call> <tool_call>{"name": "c"'
    parsed = parse_tool_calls(text)
    assert parsed.calls == (ToolCall("b", {}, 1),)
    assert [e.index for e in parsed.errors] == [0, 2]
    assert all("<tool_call> has no </tool_call>" in e.message for e in parsed.errors)
    assert [type(item) for item in parsed.in_order()] == [ToolCallError, ToolCall, ToolCallError]


def test_blocks_over_the_per_turn_bound_get_one_error_together() -> None:
    text = format_tool_call("a", {}) * 3 + "<tool_call>{bad</tool_call>" + "<tool_call>" * 500
    parsed = parse_tool_calls(text, max_calls=4)
    assert [c.index for c in parsed.calls] == [0, 1, 2]
    assert [e.index for e in parsed.errors] == [3, 4]
    assert "invalid JSON" in parsed.errors[0].message
    assert parsed.errors[1].message == ("500 more tool call(s) refused: a turn may make at most 4")


def test_unclosed_blocks_count_toward_the_bound() -> None:
    parsed = parse_tool_calls("<tool_call>" * 1000, max_calls=2)
    assert [e.index for e in parsed.errors] == [0, 1, 2]
    assert parsed.errors[2].message.startswith("998 more tool call(s) refused")


def test_an_over_long_turn_is_refused_unparsed() -> None:
    text = format_tool_call("a", {"pad": "x" * 100})
    parsed = parse_tool_calls(text, max_text_chars=50)
    assert parsed.calls == ()
    assert parsed.errors == (
        ToolCallError(f"the turn is {len(text)} characters, over the limit of 50; not parsed", -1),
    )


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_calls must be >= 1"):
        parse_tool_calls("", max_calls=0)
    with pytest.raises(ValueError, match="max_text_chars must be >= 1"):
        parse_tool_calls("", max_text_chars=0)


def test_format_round_trips_and_results_go_back_in_the_tool_role() -> None:
    call = ToolCall("calculator", {"expression": "12*34"})
    assert parse_tool_calls(format_tool_call(call.name, call.arguments)).calls == (call,)
    assert tool_message("408") == Message("tool", "408")
