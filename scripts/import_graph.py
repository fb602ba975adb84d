"""Import structure of the ``hybridflow`` package: module-level import cycles and folder cycles.

    python scripts/import_graph.py [--modules]

Reads every module's imports with ``ast`` (nothing is imported), counting only imports that
run when the module is imported: module level, not inside functions or ``TYPE_CHECKING``.
Prints the folder-to-folder edges that close a cycle between folders, and (``--modules``) the
strongly connected groups of modules that import each other. Exit code 0 either way: a
report for the redesign notes (issue 21), not a gate.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hybridflow"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runtime_imports(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))

    visit(tree.body)
    return {m for m in out if m.startswith("hybridflow")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py") if "v1" not in p.parts}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {m for m in runtime_imports(path, name) if m in modules and m != name}
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            strong(v)
    return out


def folder(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "services":
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="list module cycles too")
    args = parser.parse_args()
    edges = graph()
    folders: dict[str, set[str]] = defaultdict(set)
    for src, dsts in edges.items():
        for dst in dsts:
            if folder(src) != folder(dst):
                folders[folder(src)].add(folder(dst))
    folder_cycles = strongly_connected(dict(folders))
    module_cycles = strongly_connected(edges)
    print(f"folder cycles: {len(folder_cycles)}")
    for group in folder_cycles:
        inside = set(group)
        pairs = sorted(f"{s} -> {d}" for s in group for d in folders[s] if d in inside)
        print("  " + " | ".join(pairs))
    print(f"module cycles: {len(module_cycles)}")
    if args.modules:
        for group in module_cycles:
            print("  " + ", ".join(group))
    return 0


if __name__ == "__main__":
    sys.exit(main())
