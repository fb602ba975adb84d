"""Two ``verifiers`` (v1) tasksets written as verifiers' own docs write them, that the built-in
models can learn: the examples of docs/verifiers.md, and what its tests and curves load.

- ``ArithTaskset``: single-turn, ``a+b=`` problems as a user message, scored by
  an exact-match ``@vf.reward`` (``builtin:tiny-qwen3`` reads ChatML).
- ``CalcTaskset``: tool-using, the ``builtin:calc`` problems with a ``calculator`` tool from a
  ``vf.Toolset``, scored by the ``<answer>N</answer>`` it ends with (``builtin:tiny-tools``).

Nothing here knows hybridflow's services: ``hybridflow.agents.verifiers_env`` runs them.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

from hybridflow.envs.calculator import SYSTEM_PROMPT, make_calc_rows
from hybridflow.envs.safe_arith import CalcError, evaluate

_ANSWER = re.compile(r"<answer>\s*(-?\d{1,30})\s*</answer>")


class AnswerData(vf.TaskData):
    """A task's row: verifiers' fields (prompt, system prompt) and the answer."""

    answer: str


class ArithTask(vf.Task[AnswerData]):
    """Reward 1 when the reply is the sum exactly."""

    @vf.reward
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


class ArithConfig(vf.TasksetConfig):
    """How many problems, drawn under which seed."""

    num_tasks: int = 2048
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    """``a+b=`` with a, b in 0..9 (``builtin:arith``'s problems and format), seeded."""

    def load(self) -> list[ArithTask]:
        rng = random.Random(f"verifiers-arith:{self.config.seed}")
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            tasks.append(ArithTask(AnswerData(prompt=f"{a}+{b}=", answer=str(a + b))))
        return tasks


class CalculatorToolset(vf.Toolset[vf.SharedToolsetConfig]):
    """The ``calculator`` tool, served to the policy by MCP."""

    TOOL_PREFIX = None  # advertised bare: "calculator", the name the model was taught

    @vf.tool
    async def calculator(self, expression: str) -> str:
        """Evaluates an arithmetic expression of integers, + - * and ()."""
        try:
            return str(evaluate(expression))
        except CalcError as exc:
            return f"error: {exc}"


class CalcTask(vf.Task[AnswerData]):
    """Reward 1 when the last reply's ``<answer>N</answer>`` is the answer; counts tool calls."""

    @vf.reward
    async def answered(self, trace: vf.Trace) -> float:
        found = _ANSWER.search(trace.last_reply)
        return float(found is not None and found.group(1) == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    """How many problems, under which seed, and the calculator's toolset config."""

    num_tasks: int = 2048
    seed: int = 0
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    """``builtin:calc``'s problems with its system prompt; the calculator toolset."""

    def load(self) -> list[CalcTask]:
        return [
            CalcTask(
                AnswerData(
                    prompt=row["prompt"][-1]["content"],
                    system_prompt=SYSTEM_PROMPT,
                    answer=row["reward_model"]["ground_truth"],
                )
            )
            for row in make_calc_rows(self.config.num_tasks, self.config.seed)
        ]

    @classmethod
    def toolsets(cls, config: CalcConfig) -> list[vf.Toolset]:
        return [CalculatorToolset(config.tools)]
