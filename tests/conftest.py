"""Session-wide test setup: one torch thread per process and the built-in tiny checkpoints.

``tiny_model_path`` (``tiny_rm_path``) copies ``builtin:tiny`` (``builtin:tiny-rm``) once per
session into the session's temp dir, or uses the persistent cache under ``$HYBRIDFLOW_HOME``
when that is set (fast repeated runs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests import skips

try:
    import torch
except ImportError:  # config-only environments run the torch-free tests
    torch = None  # type: ignore[assignment]

if torch is not None:
    # The services and the tests share the machine's cores; oversubscribed OpenMP is 10-60x slower.
    torch.set_num_threads(1)

# State-changing RPCs need a token; in-process servers, clients and spawned services share
# this one (tests of the no-token refusal unset it themselves).
os.environ.setdefault("HYBRIDFLOW_TOKEN", "hybridflow-test-token")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the built-in ``tiny`` checkpoint (warm-started Llama + char tokenizer)."""
    from hybridflow.models.builtin import ensure_builtin_model

    if os.environ.get("HYBRIDFLOW_HOME"):
        return ensure_builtin_model("tiny")
    # Laid out like a HYBRIDFLOW_HOME (<home>/models/tiny-<hash>) so tests can point the env at it.
    home = tmp_path_factory.mktemp("hybridflow_home")
    return ensure_builtin_model("tiny", root=home / "models")


@pytest.fixture(scope="session")
def tiny_rm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the built-in ``tiny-rm`` reward model (``<home>/models/tiny-rm-<hash>``,
    so ``HYBRIDFLOW_HOME=<home>`` makes ``builtin:tiny-rm`` resolve to it)."""
    from hybridflow.models.builtin import ensure_builtin_model

    if os.environ.get("HYBRIDFLOW_HOME"):
        return ensure_builtin_model("tiny-rm")
    home = tmp_path_factory.mktemp("hybridflow_home_rm")
    return ensure_builtin_model("tiny-rm", root=home / "models")


# ---------------------------------------------------------------- skips (tests/skips.py)
_unlisted_skips: list[tuple[str, str]] = []


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if not skips.allowed(reason):
            _unlisted_skips.append((report.nodeid, reason))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _unlisted_skips:
        return
    verdict = "FAIL (CI=true)" if skips.in_ci() else "not allowed under CI=true"
    terminalreporter.section(f"skips outside tests/skips.py's list: {verdict}", red=True)
    for nodeid, reason in _unlisted_skips:
        terminalreporter.line(f"{nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unlisted_skips and skips.in_ci() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
