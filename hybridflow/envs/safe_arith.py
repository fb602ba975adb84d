"""Integer arithmetic on untrusted text, for the calculator tool: never ``eval``.

The expression is parsed with ``ast`` and walked by hand; only integer literals, ``+ - * //``,
unary minus/plus and parentheses are allowed. Everything is bounded so a policy cannot make
the environment slow: the expression's length, and the magnitude of every literal and every
intermediate result (with both operands bounded, one product costs nothing; without the
bound, ``9**9``-style growth through repeated ``*`` would). Anything else is a ``CalcError``
whose message the policy sees.
"""

from __future__ import annotations

import ast

MAX_EXPRESSION_CHARS = 200
"""Longest expression evaluated."""
MAX_ABS_VALUE = 10**18
"""Largest magnitude of a literal or of any intermediate result."""


class CalcError(ValueError):
    """The expression is refused: not arithmetic, too long, too large, or divides by zero."""


def evaluate(expression: str) -> int:
    """The value of ``expression``; CalcError saying why it is refused."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(
            f"expression is {len(expression)} characters, over the limit of {MAX_EXPRESSION_CHARS}"
        )
    if not expression.strip():
        raise CalcError("expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalcError(f"not an arithmetic expression: {expression!r}") from exc
    return _value(tree.body)


def _value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:  # bool is an int subclass; floats, strings refused
            raise CalcError(f"only integers are allowed, got {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Add):
            return _bounded(left + right)
        if isinstance(node.op, ast.Sub):
            return _bounded(left - right)
        if isinstance(node.op, ast.Mult):
            return _bounded(left * right)
        if isinstance(node.op, ast.FloorDiv):
            if right == 0:
                raise CalcError("division by zero")
            return _bounded(left // right)
        if isinstance(node.op, ast.Div):
            raise CalcError("only integer division is allowed: use //")
        raise CalcError(f"operator {type(node.op).__name__} is not allowed (use + - * //)")
    raise CalcError(
        f"{type(node).__name__} is not allowed (use integers, + - * // and parentheses)"
    )


def _bounded(value: int) -> int:
    if abs(value) > MAX_ABS_VALUE:
        raise CalcError(f"a number exceeds the limit of {MAX_ABS_VALUE}")
    return value
