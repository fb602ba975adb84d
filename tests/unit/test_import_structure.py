"""The package's import structure stays a hierarchy: no modules of ``hybridflow`` import each
other (directly or round a loop), and no folders do once the named, reasoned edges of
``ALLOWED_FOLDER_EDGES`` are set aside. Every import counts: module level, inside a function,
under ``TYPE_CHECKING`` (``scripts/import_graph.py`` reads them with ``ast``)."""

from __future__ import annotations

import sys
import textwrap

from tests.scripts import load_script


def _import_graph():  # type: ignore[no-untyped-def]
    return load_script("import_graph")


def test_no_module_imports_another_that_imports_it_back() -> None:
    g = _import_graph()
    edges = g.import_edges()
    assert "hybridflow.services.learner.worker" in edges  # it read the package
    _, module_lines = g.cycle_report(edges)
    assert not module_lines, "module cycles, with the imports that close them:\n" + "\n".join(
        module_lines
    )


def test_no_folder_imports_another_that_imports_it_back() -> None:
    g = _import_graph()
    folders = g.folder_edges(g.import_edges())
    for (src, dst), reason in g.ALLOWED_FOLDER_EDGES.items():
        print(f"allowed folder edge {src} -> {dst}: {reason}")
        assert dst in folders.get(src, {}), f"{src} -> {dst} is gone: drop its allow-list entry"
    left = g.without_allowed(folders)
    groups = g.strongly_connected({a: set(b) for a, b in left.items()})
    lines = []
    for group in groups:
        lines.append("cycle: " + ", ".join(group))
        for src in group:
            for dst in sorted(d for d in left[src] if d in group):
                lines.append(f"  {src} -> {dst}")
                lines += [f"    {imp.where()}" for imp in left[src][dst]]
    assert not groups, "folder cycles, with the imports that close them:\n" + "\n".join(lines)


def test_every_kind_of_import_is_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = _import_graph()
    path = tmp_path / "m.py"
    path.write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            from hybridflow.a import b
            if TYPE_CHECKING:
                from hybridflow.c import D
            def f():
                import hybridflow.e
            class K:
                def g(self):
                    from . import h
            """
        )
    )
    found = {(i.target, i.kind) for i in g.imports(path, "hybridflow.x.m")}
    assert found == {
        ("hybridflow.a", "module"),
        ("hybridflow.a.b", "module"),
        ("hybridflow.c", "type_checking"),
        ("hybridflow.c.D", "type_checking"),
        ("hybridflow.e", "function"),
        ("hybridflow.x", "function"),
        ("hybridflow.x.h", "function"),
    }


def test_the_detector_sees_a_cycle() -> None:
    g = _import_graph()
    assert g.strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]
    ]


def test_the_dpo_loss_names_the_config_offers_are_the_ones_the_math_implements() -> None:
    from hybridflow.algorithms.preference import DPO_MARGIN_LOSSES
    from hybridflow.services.learner.preference_config import DPO_LOSS_TYPES

    assert DPO_LOSS_TYPES == DPO_MARGIN_LOSSES


def test_the_planner_is_pure_and_loads_without_torch() -> None:
    """``hybridflow.resharding`` plans with numpy alone; the torch side that runs its plans
    is ``hybridflow.weights.transport``."""
    import subprocess

    code = (
        "import sys, hybridflow.resharding, hybridflow.resharding.layout, "
        "hybridflow.resharding.coverage; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
