"""The calculator environment (``hybridflow.envs.calculator:CalculatorEnv``), its no-tool
baseline (``hybridflow.envs.calculator:NoToolCalculatorEnv``), its tasks (``builtin:calc``) and
its demonstrations.

Tasks are arithmetic a tiny model cannot do in its head: a 3-4 digit number times a 2-3 digit
one, or the sum of 3-4 four-digit numbers. The opening is a short system message naming the
tool and the answer format, then the question. Per policy turn:

- ``<answer>N</answer>`` anywhere in the turn ends the episode (tool calls in the same turn
  are ignored): reward 1.0 if N is the exact integer answer, else 0.0;
- otherwise each ``<tool_call>`` block gets one ``tool`` message, in order: the value of
  ``arguments.expression`` (``hybridflow.envs.safe_arith``), or ``error: ...`` for a malformed
  call, an unknown tool, a refused expression, or a call over ``MAX_TOOL_CALLS`` per episode;
  the episode goes on, reward 0;
- a turn with neither gets a short user reminder of the two formats; the episode goes on.

``info`` on every step: ``tool_calls`` (the tool messages this turn answered with, results and
errors) and ``tool_errors`` (those that are errors), counters of this turn that the rollout
loop sums over the episode, and ``success`` (False until the answer is right).

``NoToolCalculatorEnv`` plays the same tasks with the tool switched off: every call is answered
``error: no tool in this episode`` (and counted as a call and an error), so the only way to
succeed is to answer from the model's head. It is the no-tool baseline a tool-using run is
compared with.
"""

from __future__ import annotations

import random
import re
from typing import Any

from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.safe_arith import CalcError, evaluate
from hybridflow.envs.tasks import task_row
from hybridflow.envs.tool_calls import (
    ToolCall,
    ToolCallError,
    format_tool_call,
    parse_tool_calls,
    tool_message,
)

ENV_PATH = "hybridflow.envs.calculator:CalculatorEnv"
NO_TOOL_ENV_PATH = "hybridflow.envs.calculator:NoToolCalculatorEnv"
DATA_SOURCE = "calc"
TOOL_NAME = "calculator"
SYSTEM_PROMPT = (
    f'Tool: <tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"expression": "2*3"}}}}'
    "</tool_call>. Final answer: <answer>N</answer>"
)
"""Names the tool and both formats once, in about 30 tokens of Qwen's tokenizer; without it
Qwen2.5's chat template writes its own default system message (about 20) in its place."""
NO_TOOL_ERROR = "no tool in this episode"
"""What ``NoToolCalculatorEnv`` answers every call with (after ``error: ``)."""
NO_ACTION_FEEDBACK = "Call the calculator or reply <answer>N</answer>."
MAX_TOOL_CALLS = 8
"""Tool calls one episode may make; later calls are answered with an error."""
MAX_CALLS_PER_TURN = 4
"""Tool calls one turn may make (``parse_tool_calls``'s bound)."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INTEGER = re.compile(r"-?\d{1,30}")


class CalculatorEnv:
    """One episode of a ``builtin:calc`` task (see the module docstring for the rules)."""

    def __init__(self) -> None:
        self.answer: int | None = None
        self.num_calls = 0
        self.success = False

    def reset(self, task: Task) -> tuple[Message, ...]:
        truth = (task.ground_truth or "").strip()
        if not _INTEGER.fullmatch(truth):
            raise ValueError(
                f"task.ground_truth must be an integer for the calculator, got {task.ground_truth!r}"
            )
        self.answer = int(truth)
        return (Message("system", SYSTEM_PROMPT), Message("user", task.prompt))

    def step(self, action: str) -> StepResult:
        if self.answer is None:
            raise RuntimeError("step() before reset()")
        final = _ANSWER.search(action)
        if final is not None:
            given = final.group(1).strip()
            self.success = bool(_INTEGER.fullmatch(given)) and int(given) == self.answer
            return StepResult(reward=float(self.success), done=True, info=self._info(0, 0))
        items = parse_tool_calls(action, max_calls=MAX_CALLS_PER_TURN).in_order()
        if not items:
            feedback = (Message("user", NO_ACTION_FEEDBACK),)
            return StepResult(observation=feedback, info=self._info(0, 0))
        answers = [self._answer_call(item) for item in items]
        observation = tuple(tool_message(text) for text, _ in answers)
        info = self._info(len(answers), sum(failed for _, failed in answers))
        return StepResult(observation=observation, info=info)

    def _answer_call(self, item: ToolCall | ToolCallError) -> tuple[str, bool]:
        """(the tool message's text, whether it is an error)."""
        self.num_calls += 1
        try:
            return str(self._run(item)), False
        except CalcError as exc:
            return f"error: {exc}", True

    def _run(self, item: ToolCall | ToolCallError) -> int:
        if isinstance(item, ToolCallError):
            raise CalcError(item.message)
        if self.num_calls > MAX_TOOL_CALLS:
            raise CalcError(f"over the limit of {MAX_TOOL_CALLS} tool calls; give your answer")
        if item.name != TOOL_NAME:
            raise CalcError(f"unknown tool {item.name!r}; the tool is {TOOL_NAME!r}")
        expression = item.arguments.get("expression")
        if not isinstance(expression, str):
            raise CalcError(f'field "arguments.expression" must be a string, got {expression!r}')
        return evaluate(expression)

    def _info(self, tool_calls: int, tool_errors: int) -> dict[str, Any]:
        return {"tool_calls": tool_calls, "tool_errors": tool_errors, "success": self.success}


class NoToolCalculatorEnv(CalculatorEnv):
    """``CalculatorEnv`` with the tool switched off: the no-tool baseline (module docstring)."""

    def _run(self, item: ToolCall | ToolCallError) -> int:
        raise CalcError(NO_TOOL_ERROR)


def calc_task(rng: random.Random, index: int = 0) -> Task:
    """One task: a product (3-4 digits times 2-3 digits) or a sum of 3-4 four-digit numbers."""
    if rng.random() < 0.5:
        numbers = [rng.randint(100, 9999), rng.randint(10, 999)]
        op = "*"
        value = numbers[0] * numbers[1]
    else:
        numbers = [rng.randint(1000, 9999) for _ in range(rng.randint(3, 4))]
        op = "+"
        value = sum(numbers)
    expression = f" {op} ".join(str(n) for n in numbers)
    return Task(
        prompt=f"What is {expression}?",
        ground_truth=str(value),
        data_source=DATA_SOURCE,
        extra_info={"index": index, "expression": expression},
    )


def make_calc_rows(num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` verl rows of calculator tasks, deterministic in (num, seed); a longer list with
    the same seed starts with the rows of a shorter one."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    rng = random.Random(f"hybridflow-calc:{seed}")
    return [task_row(calc_task(rng, i), CalculatorEnv(), ENV_PATH) for i in range(num)]


def calc_demonstration(task: Task) -> list[Message]:
    """A successful episode: the question, one calculator call on the task's expression (as
    the question spells it, so a small model learns to copy it verbatim), its result (the
    ground truth, which the task states), the final answer."""
    expression = task.extra_info.get("expression")
    if not isinstance(expression, str) or task.ground_truth is None:
        raise ValueError("task: a calc demonstration needs extra_info.expression and ground_truth")
    return [
        Message("system", SYSTEM_PROMPT),
        Message("user", task.prompt),
        Message("assistant", format_tool_call(TOOL_NAME, {"expression": expression})),
        tool_message(task.ground_truth),
        Message("assistant", f"<answer>{task.ground_truth}</answer>"),
    ]


def calc_direct_demonstration(
    task: Task, rng: random.Random, max_changed: int = 3
) -> list[Message]:
    """An episode that answers at once, without the tool, and is wrong: the true answer with
    1..``max_changed`` of its digits changed (a plausible guess from a model's head). A warm
    start mixes these with ``calc_demonstration`` so that RL finds the tool worth calling."""
    if task.ground_truth is None or not _INTEGER.fullmatch(task.ground_truth):
        raise ValueError("task: a calc demonstration needs an integer ground_truth")
    if max_changed < 1:
        raise ValueError(f"max_changed must be >= 1, got {max_changed}")
    digits = list(task.ground_truth.lstrip("-"))
    positions = rng.sample(range(len(digits)), min(len(digits), rng.randint(1, max_changed)))
    for i in positions:
        first = i == 0 and len(digits) > 1  # keep the number of digits: no leading zero
        digits[i] = rng.choice([d for d in "0123456789"[first:] if d != digits[i]])
    wrong = ("-" if task.ground_truth.startswith("-") else "") + "".join(digits)
    return [
        Message("system", SYSTEM_PROMPT),
        Message("user", task.prompt),
        Message("assistant", f"<answer>{wrong}</answer>"),
    ]
