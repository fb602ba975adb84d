"""Every RPC a client of ours makes carries a deadline (issue 8: bounded failure detection).

Scans the package's source for calls on a gRPC stub (``<...stub...>.Method(...)``, also
``.future``) and fails naming each one without a ``timeout=`` keyword.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hybridflow

ROOT = Path(hybridflow.__file__).parent


def _is_stub(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return "stub" in node.attr.lower()
    if isinstance(node, ast.Name):
        return "stub" in node.id.lower()
    if isinstance(node, ast.Call):  # HealthStub(channel).Check(...)
        return _is_stub(node.func)
    return False


def _stub_calls(tree: ast.AST) -> list[ast.Call]:
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        target = node.func
        if target.attr in ("future", "with_call") and isinstance(target.value, ast.Attribute):
            target = target.value
        if target.attr[:1].isupper() and _is_stub(target.value):
            calls.append(node)
    return calls


def test_every_stub_call_has_a_deadline():
    missing, seen = [], 0
    for path in sorted(ROOT.rglob("*.py")):
        if "v1" in path.relative_to(ROOT).parts:  # generated code
            continue
        for call in _stub_calls(ast.parse(path.read_text())):
            seen += 1
            if not any(k.arg == "timeout" for k in call.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert seen >= 10, "the scan found too few stub calls to be looking at the right code"
    assert not missing, f"RPCs without a deadline: {missing}"
