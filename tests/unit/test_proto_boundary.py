"""Generated proto code (``hybridflow/v1/``) is imported only by servicers, clients and the
conversion modules (STYLE.md rule 2); everything else works on the domain types. Every import
counts, as in ``scripts/import_graph.py``: module level, inside a function, under
``TYPE_CHECKING``. The modules are read with ``ast``; nothing is imported."""

from __future__ import annotations

import textwrap

from tests.scripts import load_script

PROTO_PACKAGE = "hybridflow.v1"

BOUNDARY_NAMES = ("servicer", "client", "convert")
"""A module of one of these names, in any folder, may import the generated code: a service's
servicer (proto → domain → call → proto), its client, and its one conversion module."""

ALLOWED_MODULES: dict[str, str] = {
    "hybridflow.rpc.codec": (
        "the conversion of common.proto's shared messages (TokenBatch, Tensor, Chunk), "
        "which every service's convert module builds on"
    ),
    "hybridflow.rpc.routing": "the conversion of common.proto's RoutedExperts (as above)",
    "hybridflow.rpc.wire": (
        "common.proto's TokenBatch / Tensor / Chunk encoded straight from numpy buffers: "
        "their field numbers and headers (as above)"
    ),
    "hybridflow.rpc.channel": (
        "reads the services' descriptors (the schema, no message) to give every streaming "
        "method gRPC's no-retry service config"
    ),
}
"""Modules outside the naming rule that may import the generated code, each with its reason."""


def _graph():  # type: ignore[no-untyped-def]
    return load_script("import_graph")


def _is_proto(target: str) -> bool:
    return target == PROTO_PACKAGE or target.startswith(PROTO_PACKAGE + ".")


def _allowed(module: str) -> bool:
    return module.rpartition(".")[2] in BOUNDARY_NAMES or module in ALLOWED_MODULES


def proto_imports(g, name: str, path) -> list:  # type: ignore[no-untyped-def]
    """Each import statement of generated code in the module (one per line)."""
    seen: set[int] = set()
    out = []
    for imp in g.imports(path, name):
        if _is_proto(imp.target) and imp.line not in seen:
            seen.add(imp.line)
            out.append(imp)
    return out


def test_only_servicers_clients_and_convert_modules_import_generated_protos() -> None:
    g = _graph()
    found = g.modules()
    assert "hybridflow.services.learner.servicer" in found  # it read the package
    offenders = []
    for name, path in sorted(found.items()):
        if not _allowed(name):
            offenders += [imp.where() for imp in proto_imports(g, name, path)]
    assert not offenders, (
        "generated proto code imported outside servicers, clients and convert modules "
        "(put the use behind the service's convert module, client or servicer):\n"
        + "\n".join(offenders)
    )


def test_every_allowed_module_still_imports_generated_protos() -> None:
    g = _graph()
    found = g.modules()
    for name, reason in ALLOWED_MODULES.items():
        assert name in found, f"{name} is gone: drop its entry ({reason})"
        assert proto_imports(g, name, found[name]), f"{name} no longer needs its entry"


def test_the_detector_sees_every_kind_of_proto_import(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = _graph()
    path = tmp_path / "m.py"
    path.write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            from grpc_health.v1 import health_pb2
            from hybridflow import v1
            if TYPE_CHECKING:
                from hybridflow.v1 import common_pb2
            def f():
                import hybridflow.v1.rollout_pb2_grpc
            """
        )
    )
    found = proto_imports(g, "hybridflow.x.m", path)
    assert [(imp.line, imp.kind) for imp in found] == [
        (4, "module"),
        (6, "type_checking"),
        (8, "function"),
    ]
    assert not _allowed("hybridflow.x.m")
    assert _allowed("hybridflow.services.rollout.convert")
    assert _allowed("hybridflow.rpc.codec")
