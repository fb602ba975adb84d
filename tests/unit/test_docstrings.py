"""Every public module and class of the product states its boundary in a docstring."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hybridflow"


def _sources() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts]


def test_every_public_class_has_a_docstring() -> None:
    missing = []
    for path in _sources():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                if ast.get_docstring(node) is None:
                    missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert len(_sources()) > 150 and missing == []


def test_every_module_has_a_docstring() -> None:
    missing = [
        str(p.relative_to(PACKAGE.parent))
        for p in _sources()
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert missing == []
