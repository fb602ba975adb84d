"""The calculator task (``builtin:calc``) played by an agent over the OpenAI chat API
(``coordinator.multi_turn.agent: hybridflow.envs.calc_agent:calc_agent``): the agents-as-
environments counterpart of ``CalculatorEnv``, and the example of docs/agents.md.

The agent sends the task with the calculator's instructions and a ``calculator`` tool;
each tool call the policy makes (the endpoint hands them over as OpenAI ``tool_calls``) is
evaluated here and sent back as a ``tool`` message; an ``<answer>N</answer>`` ends the
episode: reward 1.0 if N is the answer, else 0.0. At most ``MAX_TURNS`` requests.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hybridflow.envs.base import Task
from hybridflow.envs.calculator import SYSTEM_PROMPT
from hybridflow.envs.safe_arith import CalcError, evaluate

AGENT_PATH = "hybridflow.envs.calc_agent:calc_agent"
MAX_TURNS = 3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluates an arithmetic expression of integers, + - * and ().",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
_ANSWER = re.compile(r"<answer>\s*(-?\d{1,30})\s*</answer>")


def calc_agent(task: Task, client: Any) -> dict[str, Any]:
    """One episode; the reward and its counters (``tool_calls``, ``tool_errors``,
    ``success``)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
    ]
    calls = errors = 0
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        answer = _ANSWER.search(message.content or "")
        if answer is not None:
            success = answer.group(1) == (task.ground_truth or "").strip()
            return {
                "reward": float(success),
                "success": success,
                "tool_calls": calls,
                "tool_errors": errors,
            }
        for call in message.tool_calls or []:
            calls += 1
            try:
                result = str(evaluate(json.loads(call.function.arguments)["expression"]))
            except (CalcError, KeyError, TypeError, json.JSONDecodeError) as exc:
                errors += 1
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not message.tool_calls:
            messages.append(
                {"role": "user", "content": "Call the calculator or reply <answer>N</answer>."}
            )
    return {"reward": 0.0, "success": False, "tool_calls": calls, "tool_errors": errors}
