"""A code task with a ``python`` tool (``hybridflow.envs.python_tool:PythonToolEnv``): the
policy may run Python in the sandbox before it answers with its program, which is then run
against the task's tests in the sandbox too.

Tasks are code rows (``builtin:code``, or any row whose ground truth holds ``CodeTests``: asserts
or stdin/stdout cases). The opening is a short system message naming the tool and the
answer, then the task. Per policy turn:

- each ``<tool_call>`` block (Hermes format, as the calculator's) whose name is ``python``
  runs ``arguments.code`` as a program in the sandbox pool (``hybridflow.sandbox.shared``:
  the environment service's ``environment.sandbox``); its answer is one ``tool`` message:
  the program's stdout (and stderr's last lines), cut to ``MAX_OBSERVATION_CHARS``, with the
  limit it hit when it was stopped (``[stopped: wall time past 5s]``). A malformed call, an
  unknown tool or a call past ``MAX_TOOL_CALLS`` is answered ``error: ...``; the episode goes
  on, reward 0;
- a turn without a tool call is the answer: its program (``<answer>`` tags, a fenced block
  or the whole text) is run against the tests; reward the fraction passed, done.

``info``: ``tool_calls`` and ``tool_errors`` (calls answered with an error or stopped at a
limit) of this turn, ``success`` (all tests passed), and on the last turn ``outcome`` (the
``CodeVerdict``'s). A program past its limits costs its own wall time (keep
``environment.sandbox.wall_s`` below ``environment.step_timeout_s``), never the service.
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.tool_calls import ToolCall, ToolCallError, parse_tool_calls, tool_message
from hybridflow.sandbox import shared
from hybridflow.sandbox.code_tests import CodeTests, extract_program, run_tests

ENV_PATH = "hybridflow.envs.python_tool:PythonToolEnv"
TOOL_NAME = "python"
SYSTEM_PROMPT = (
    f'Tool: <tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"code": "print(2*3)"}}}}'
    "</tool_call> runs Python. Reply with the program when done."
)
MAX_TOOL_CALLS = 8
"""Tool calls one episode may make; later calls are answered with an error."""
MAX_CALLS_PER_TURN = 4
MAX_OBSERVATION_CHARS = 2000
"""Longest tool message: a program's output past it is cut (its end kept)."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class PythonToolEnv:
    """One episode of a code task with the ``python`` tool (module docstring)."""

    def __init__(self) -> None:
        self.tests: CodeTests | None = None
        self.num_calls = 0

    def reset(self, task: Task) -> tuple[Message, ...]:
        self.tests = CodeTests.parse(task.ground_truth)
        return (Message("system", SYSTEM_PROMPT), Message("user", task.prompt))

    def step(self, action: str) -> StepResult:
        if self.tests is None:
            raise RuntimeError("step() before reset()")
        items = parse_tool_calls(action, max_calls=MAX_CALLS_PER_TURN).in_order()
        if not items:
            return self._answer(action)
        answers = [self._tool(item) for item in items]
        info = {
            "tool_calls": len(answers),
            "tool_errors": sum(failed for _, failed in answers),
            "success": False,
        }
        return StepResult(observation=tuple(tool_message(t) for t, _ in answers), info=info)

    def _answer(self, action: str) -> StepResult:
        assert self.tests is not None
        tagged = _ANSWER.search(action)
        program = extract_program(tagged.group(1) if tagged else action)
        config = shared.limits_config()
        verdict = run_tests(shared.shared_pool(), program, self.tests, config.limits())
        info: dict[str, Any] = {
            "tool_calls": 0,
            "tool_errors": 0,
            "success": verdict.outcome == "passed",
            "outcome": verdict.outcome,
        }
        return StepResult(reward=verdict.fraction, done=True, info=info)

    def _tool(self, item: ToolCall | ToolCallError) -> tuple[str, bool]:
        """(the tool message, whether it is an error)."""
        self.num_calls += 1
        if isinstance(item, ToolCallError):
            return f"error: {item.message}", True
        if self.num_calls > MAX_TOOL_CALLS:
            return f"error: over the limit of {MAX_TOOL_CALLS} tool calls; give your answer", True
        if item.name != TOOL_NAME:
            return f"error: unknown tool {item.name!r}; the tool is {TOOL_NAME!r}", True
        code = item.arguments.get("code")
        if not isinstance(code, str):
            return f'error: field "arguments.code" must be a string, got {code!r}', True
        config = shared.limits_config()
        result = shared.shared_pool().run(
            ["python3", "-I", "main.py"], {"main.py": code}, config.limits()
        )
        text = result.stdout.decode(errors="replace")
        err = result.stderr.decode(errors="replace").strip().splitlines()[-3:]
        if err:
            text += ("\n" if text and not text.endswith("\n") else "") + "\n".join(err)
        stopped = result.outcome not in ("ok", "exit")
        if stopped:
            text += f"\n[stopped: {result.reason}]"
        if len(text) > MAX_OBSERVATION_CHARS:
            text = "[cut]..." + text[-(MAX_OBSERVATION_CHARS - 8) :]
        return text, stopped or result.outcome == "exit"
