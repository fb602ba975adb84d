"""CalculatorEnv and its safe evaluator: answers, exact tool results, errors that keep the
episode going, the bounds, and that nothing is ever eval'd."""

from __future__ import annotations

import ast
import builtins
import random
from typing import Any

import pytest

from hybridflow.envs import calculator
from hybridflow.envs.base import Environment, Message, StepResult, Task
from hybridflow.envs.calculator import (
    MAX_TOOL_CALLS,
    NO_ACTION_FEEDBACK,
    SYSTEM_PROMPT,
    CalculatorEnv,
    calc_task,
)
from hybridflow.envs.safe_arith import MAX_ABS_VALUE, MAX_EXPRESSION_CHARS, CalcError, evaluate
from hybridflow.envs.tool_calls import format_tool_call


def call(expression: object, name: str = "calculator") -> str:
    return format_tool_call(name, {"expression": expression})


def started(answer: str = "5402") -> CalculatorEnv:
    env = CalculatorEnv()
    assert env.reset(Task("What is 74 * 73?", ground_truth=answer)) == (
        Message("system", SYSTEM_PROMPT),
        Message("user", "What is 74 * 73?"),
    )
    return env


def test_it_is_an_environment() -> None:
    assert isinstance(CalculatorEnv(), Environment)


def test_the_right_answer_ends_with_reward_one() -> None:
    env = started()
    assert env.step("<answer>5402</answer>") == StepResult(
        reward=1.0, done=True, info={"tool_calls": 0, "tool_errors": 0, "success": True}
    )


@pytest.mark.parametrize("answer", ["5401", "", "54O2", "5402.0", "five"])
def test_a_wrong_or_unreadable_answer_ends_with_reward_zero(answer: str) -> None:
    result = started().step(f"I think <answer>{answer}</answer>")
    assert (result.done, result.reward, result.info["success"]) == (True, 0.0, False)
    assert result.observation == ()


def test_a_call_gets_its_exact_result_then_the_answer_counts() -> None:
    env = started()
    result = env.step("Let me use the tool. " + call("74*73"))
    assert result == StepResult(
        observation=(Message("tool", "5402"),),
        info={"tool_calls": 1, "tool_errors": 0, "success": False},
    )
    final = env.step("<answer> 5402 </answer>")
    assert final.done and final.reward == 1.0
    assert final.info == {"tool_calls": 0, "tool_errors": 0, "success": True}


def test_several_calls_in_one_turn_are_answered_in_order_errors_included() -> None:
    env = started()
    env.step(call("1+1"))  # the counters are per turn: this one is not in the next
    turn = call("1+2") + "<tool_call>{broken</tool_call>" + call("(3-10)//2")
    result = env.step(turn)
    assert [m.role for m in result.observation] == ["tool", "tool", "tool"]
    assert result.observation[0].content == "3"
    assert result.observation[1].content.startswith("error: tool call 1: invalid JSON")
    assert result.observation[2].content == "-4"
    assert result.info == {"tool_calls": 3, "tool_errors": 1, "success": False}


@pytest.mark.parametrize(
    ("turn", "says"),
    [
        ("<tool_call>not json</tool_call>", "error: tool call 0: invalid JSON"),
        ('<tool_call>{"name": "calculator", "arguments": 7}</tool_call>', '"arguments" must be'),
        ("<tool_call>" + '{"name": "calculator"', "has no </tool_call>"),
        (call("2*3", name="python"), "error: unknown tool 'python'"),
        (call(6), 'field "arguments.expression" must be a string, got 6'),
        (call("__import__('os')"), "error: Call is not allowed"),
        (call("2**10"), "operator Pow is not allowed"),
        (call("7/2"), "use //"),
        (call("1//0"), "division by zero"),
        (call("1.5*2"), "only integers are allowed"),
        (call("2*"), "not an arithmetic expression"),
    ],
)
def test_a_bad_call_gets_an_error_observation_and_the_episode_goes_on(turn: str, says: str) -> None:
    env = started()
    result = env.step(turn)
    assert not result.done and result.reward == 0.0
    assert len(result.observation) == 1 and result.observation[0].role == "tool"
    assert says in result.observation[0].content
    assert result.info["tool_errors"] == 1
    assert env.step(call("74*73")).observation == (Message("tool", "5402"),)
    assert env.step("<answer>5402</answer>").reward == 1.0


def test_a_turn_with_neither_call_nor_answer_gets_a_reminder() -> None:
    result = started().step("Hmm, let me think about 74 times 73.")
    assert result == StepResult(
        observation=(Message("user", NO_ACTION_FEEDBACK),),
        info={"tool_calls": 0, "tool_errors": 0, "success": False},
    )


def test_calls_over_the_episode_cap_are_refused() -> None:
    env = started()
    for _ in range(MAX_TOOL_CALLS):
        assert env.step(call("1+1")).observation == (Message("tool", "2"),)
    over = env.step(call("1+1") + call("2+2"))
    assert [m.content for m in over.observation] == [
        f"error: over the limit of {MAX_TOOL_CALLS} tool calls; give your answer"
    ] * 2
    assert over.info == {"tool_calls": 2, "tool_errors": 2, "success": False}
    assert env.step("<answer>5402</answer>").reward == 1.0


def test_an_answer_in_a_turn_with_a_call_ends_the_episode() -> None:
    result = started().step(call("74*73") + "<answer>5402</answer>")
    assert result.done and result.reward == 1.0 and result.info["tool_calls"] == 0


@pytest.mark.parametrize("truth", [None, "", "12.5", "abc"])
def test_reset_refuses_a_task_without_an_integer_answer(truth: str | None) -> None:
    with pytest.raises(ValueError, match="task.ground_truth must be an integer"):
        CalculatorEnv().reset(Task("q", ground_truth=truth))


def test_step_before_reset_is_a_bug() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        CalculatorEnv().step("<answer>1</answer>")


# ------------------------------------------------------------ the evaluator
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("4821*67", 323007),
        ("7558+6172+4746+2152", 20628),
        (" (12 - 20) * -3 ", 24),
        ("-7//2", -4),
        ("+5", 5),
        (str(MAX_ABS_VALUE), MAX_ABS_VALUE),
        ("(" * 99 + "1" + ")" * 99, 1),
    ],
)
def test_evaluate_integer_arithmetic(expression: str, value: int) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        (str(MAX_ABS_VALUE + 1), "exceeds the limit"),
        (f"{10**12}*{10**12}", "exceeds the limit"),
        (f"{MAX_ABS_VALUE}+1", "exceeds the limit"),
        ("9" * 100, "exceeds the limit"),
        ("1+" * (MAX_EXPRESSION_CHARS // 2) + "1", "over the limit of"),
        ("(1+2", "not an arithmetic expression"),
        ("True+1", "only integers"),
        ("x*2", "Name is not allowed"),
        ("'a'*3", "only integers"),
        ("[1]*3", "List is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("1<<62", "operator LShift is not allowed"),
        ("5%3", "operator Mod is not allowed"),
        ("   ", "expression is empty"),
    ],
)
def test_evaluate_refuses_what_is_not_small_integer_arithmetic(expression: str, says: str) -> None:
    with pytest.raises(CalcError, match=says):
        evaluate(expression)


def test_nothing_is_ever_evaluated_by_python(monkeypatch: pytest.MonkeyPatch) -> None:
    real_compile = builtins.compile

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval/exec called")

    def only_to_ast(source: Any, filename: Any, mode: str, flags: int = 0, **kw: Any) -> Any:
        if not flags & ast.PyCF_ONLY_AST:  # ast.parse compiles to a tree only: allowed
            raise AssertionError("compile to code called")
        return real_compile(source, filename, mode, flags, **kw)

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    monkeypatch.setattr(builtins, "compile", only_to_ast)
    env = started()
    assert env.step(call("74*73")).observation == (Message("tool", "5402"),)
    assert "not allowed" in env.step(call("__import__('os').system('true')")).observation[0].content


def test_tasks_are_beyond_mental_arithmetic_and_their_answers_right() -> None:
    rng = random.Random(0)
    tasks = [calc_task(rng, i) for i in range(200)]
    products = [t for t in tasks if "*" in t.extra_info["expression"]]
    sums = [t for t in tasks if "+" in t.extra_info["expression"]]
    assert products and sums and len(products) + len(sums) == len(tasks)
    for task in tasks:
        assert str(evaluate(task.extra_info["expression"])) == task.ground_truth
        assert task.data_source == calculator.DATA_SOURCE
    for task in products:
        a, b = (int(x) for x in task.extra_info["expression"].split("*"))
        assert 100 <= a <= 9999 and 10 <= b <= 999
    for task in sums:
        numbers = [int(x) for x in task.extra_info["expression"].split("+")]
        assert 3 <= len(numbers) <= 4 and all(1000 <= n <= 9999 for n in numbers)


def test_the_no_tool_variant_answers_every_call_with_an_error() -> None:
    env = calculator.NoToolCalculatorEnv()
    env.reset(Task("What is 74 * 73?", ground_truth="5402"))
    result = env.step(call("74*73"))
    assert result.observation == (Message("tool", "error: no tool in this episode"),)
    assert (result.done, result.info["tool_calls"], result.info["tool_errors"]) == (False, 1, 1)
    assert env.step("<answer>5402</answer>").reward == 1.0  # the head still may answer


def test_a_direct_demonstration_answers_wrong_without_the_tool() -> None:
    rng = random.Random(3)
    for _ in range(64):
        task = calc_task(rng)
        conversation = calculator.calc_direct_demonstration(task, rng)
        assert [m.role for m in conversation] == ["system", "user", "assistant"]
        given = conversation[-1].content.removeprefix("<answer>").removesuffix("</answer>")
        truth = task.ground_truth or ""
        assert given != truth and len(given) == len(truth) and given[0] != "0"
        assert sum(a != b for a, b in zip(given, truth)) <= 3
        env = CalculatorEnv()
        env.reset(task)
        assert env.step(conversation[-1].content) == StepResult(
            reward=0.0, done=True, info={"tool_calls": 0, "tool_errors": 0, "success": False}
        )
