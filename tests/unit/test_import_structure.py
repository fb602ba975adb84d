"""The package's import structure stays a hierarchy: no two folders of ``hybridflow`` import
each other (directly or round a loop) when their modules load, and no modules do
(``scripts/import_graph.py`` reads the imports with ``ast``)."""

from __future__ import annotations

import sys

from tests.scripts import load_script


def _import_graph():  # type: ignore[no-untyped-def]
    return load_script("import_graph")


def test_no_folder_imports_another_that_imports_it_back() -> None:
    g = _import_graph()
    edges = g.graph()
    assert "hybridflow.services.learner.worker" in edges  # it read the package
    folders: dict[str, set[str]] = {}
    for src, dsts in edges.items():
        for dst in dsts:
            if g.folder(src) != g.folder(dst):
                folders.setdefault(g.folder(src), set()).add(g.folder(dst))
    assert g.strongly_connected(folders) == []
    assert g.strongly_connected(edges) == []


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
