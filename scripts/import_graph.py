"""Import structure of the ``hybridflow`` package: module cycles and folder cycles.

    python scripts/import_graph.py [--modules] [--edges]

Reads every module's imports with ``ast`` (nothing is imported) and counts all of them: those
that run when the module loads (``module``), those inside a function or method, which run
when it is called (``function``), and those under ``if TYPE_CHECKING:`` (``type_checking``).
A cycle closed by a deferred or type-only import is still a cycle: the two modules cannot be
read, tested or moved apart. Prints the strongly connected groups of folders and of modules,
each with the import lines that close it (``--modules`` for the module groups' lines,
``--edges`` for every edge with its kind). Exit code 1 when there is a module cycle, or a
folder cycle left once the edges of ``ALLOWED_FOLDER_EDGES`` are set aside; the gate is
``tests/unit/test_import_structure.py``.

The script has no notion of layers: it counts cycles, not which way an edge points. The
allow-list names each folder edge still closing the one folder cycle, with its reason; the
counts it prints are the honest ones, with every edge in.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hybridflow"

KINDS = ("module", "function", "type_checking")

ALLOWED_FOLDER_EDGES: dict[tuple[str, str], str] = {}
"""Folder edges set aside when the gate looks for folder cycles, each with why it is still
there and what removes it. Module cycles have no allow-list."""


@dataclass(frozen=True)
class Import:
    """One import statement's reference to a module of the package."""

    target: str
    kind: str  # one of KINDS
    path: Path
    line: int
    text: str

    def where(self) -> str:
        rel = self.path.relative_to(ROOT.parent)
        return f"{rel}:{self.line} [{self.kind}] {self.text}"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def imports(path: Path, name: str) -> list[Import]:
    """Every import of a ``hybridflow`` module in ``path``, with its kind and line."""
    tree = ast.parse(path.read_text())
    out: list[Import] = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def add(node: ast.Import | ast.ImportFrom, kind: str) -> None:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        text = ast.unparse(node)
        for target in targets:
            if target.startswith("hybridflow"):
                out.append(Import(target, kind, path, node.lineno, text))

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            add(node, kind)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kind = "function" if kind == "module" else kind
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "type_checking")
            for child in node.orelse:
                visit(child, kind)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(tree, "module")
    return out


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py") if "v1" not in p.parts}


def import_edges() -> dict[str, dict[str, list[Import]]]:
    """``edges[src][dst]``: the imports in module ``src`` that reach module ``dst``."""
    found = modules()
    edges: dict[str, dict[str, list[Import]]] = {}
    for name, path in found.items():
        by_target: dict[str, list[Import]] = defaultdict(list)
        for imp in imports(path, name):
            if imp.target in found and imp.target != name:
                by_target[imp.target].append(imp)
        edges[name] = dict(by_target)
    return edges


def graph() -> dict[str, set[str]]:
    """Module to the modules it imports, every kind of import counted."""
    return {src: set(dsts) for src, dsts in import_edges().items()}


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
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(out)


def folder(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "services":
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def folder_edges(
    edges: dict[str, dict[str, list[Import]]],
) -> dict[str, dict[str, list[Import]]]:
    """``out[a][b]``: the imports by which a module of folder ``a`` reaches one of ``b``."""
    out: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
    for src, dsts in edges.items():
        for dst, imps in dsts.items():
            if folder(src) != folder(dst):
                out[folder(src)][folder(dst)].extend(imps)
    return {a: dict(b) for a, b in out.items()}


def cycle_report(edges: dict[str, dict[str, list[Import]]]) -> tuple[list[str], list[str]]:
    """Lines naming each folder cycle and each module cycle with the imports that close it."""

    def describe(detail: dict[str, dict[str, list[Import]]]) -> list[str]:
        lines: list[str] = []
        groups = strongly_connected({a: set(b) for a, b in detail.items()})
        for group in groups:
            inside = set(group)
            lines.append("cycle: " + ", ".join(group))
            for src in group:
                for dst in sorted(d for d in detail.get(src, {}) if d in inside):
                    lines.append(f"  {src} -> {dst}")
                    seen: set[tuple[Path, int]] = set()
                    for imp in detail[src][dst]:
                        if (imp.path, imp.line) not in seen:
                            seen.add((imp.path, imp.line))
                            lines.append(f"    {imp.where()}")
        return lines

    return describe(folder_edges(edges)), describe(edges)


def counts(edges: dict[str, dict[str, list[Import]]]) -> tuple[int, int]:
    """(folder cycles, module cycles), every kind of import counted, nothing allowed."""
    folders = {a: set(b) for a, b in folder_edges(edges).items()}
    modules_graph = {src: set(dsts) for src, dsts in edges.items()}
    return len(strongly_connected(folders)), len(strongly_connected(modules_graph))


def without_allowed(
    folders: dict[str, dict[str, list[Import]]],
) -> dict[str, dict[str, list[Import]]]:
    """The folder edges less those of ``ALLOWED_FOLDER_EDGES``."""
    return {
        a: {b: imps for b, imps in dsts.items() if (a, b) not in ALLOWED_FOLDER_EDGES}
        for a, dsts in folders.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="the module cycles' lines too")
    parser.add_argument("--edges", action="store_true", help="every edge with its kind")
    args = parser.parse_args()
    edges = import_edges()
    if args.edges:
        for src in sorted(edges):
            for dst in sorted(edges[src]):
                kinds = sorted({i.kind for i in edges[src][dst]}, key=KINDS.index)
                print(f"{src} -> {dst} [{', '.join(kinds)}]")
    folder_lines, module_lines = cycle_report(edges)
    num_folder, num_module = counts(edges)
    folders = folder_edges(edges)
    left = strongly_connected({a: set(b) for a, b in without_allowed(folders).items()})
    print(f"folder cycles: {num_folder}")
    for line in folder_lines:
        print("  " + line)
    print(f"folder cycles without the {len(ALLOWED_FOLDER_EDGES)} allowed edges: {len(left)}")
    for (src, dst), reason in ALLOWED_FOLDER_EDGES.items():
        present = "" if dst in folders.get(src, {}) else " (gone: drop this entry)"
        print(f"  allowed {src} -> {dst}{present}: {reason}")
    print(f"module cycles: {num_module}")
    for line in module_lines if args.modules else [x for x in module_lines if "cycle:" in x]:
        print("  " + line)
    return 1 if left or num_module else 0


if __name__ == "__main__":
    sys.exit(main())
