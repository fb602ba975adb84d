"""Which skips a test run may have, and the skips this machine allows.

A skip names its reason. Locked packages are imported plainly (a broken install fails the
test, it never turns into a skip). What may skip is a short, named list, each reason built by
one function here so that its text starts with a known prefix:

- ``no_gpu(what)``: the test needs a CUDA device and this machine has none;
- ``needs_root(what)``: the test needs root (mounts, network namespaces, Slurm daemons).

Under ``CI=true`` (``.ci/run`` sets it) any other skip fails the run: the pytest hooks at the
end of this module (``tests/conftest.py`` registers them; ``-p tests.skips`` elsewhere)
collect every skipped test and collection with its reason and, at the end, list the ones
outside this list and set a failing exit status. Outside CI they are printed like any skip
(``make test`` shows every reason).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

NO_GPU = "no GPU"
NEEDS_ROOT = "needs root"
ALLOWED = (NO_GPU, NEEDS_ROOT)
"""Reason prefixes a CI run accepts."""


def no_gpu(what: str) -> str:
    """The reason of a skip for a test that needs a CUDA device."""
    return f"{NO_GPU}: {what}"


def needs_root(what: str) -> str:
    """The reason of a skip for a test that needs root."""
    return f"{NEEDS_ROOT}: {what}"


def is_root() -> bool:
    return os.geteuid() == 0


def allowed(reason: str) -> bool:
    """True when a CI run may skip for ``reason`` (pytest's "Skipped: " prefix tolerated)."""
    return reason.removeprefix("Skipped: ").startswith(ALLOWED)


def in_ci() -> bool:
    """CI runs refuse unlisted skips (``CI=true``, as most CI systems and ``.ci/run`` set)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


# ---------------------------------------------------------------- the hooks
_unlisted_skips: list[tuple[str, str]] = []


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if not allowed(reason):
            _unlisted_skips.append((report.nodeid, reason))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _unlisted_skips:
        return
    verdict = "FAIL (CI=true)" if in_ci() else "not allowed under CI=true"
    terminalreporter.section(f"skips outside tests/skips.py's list: {verdict}", red=True)
    for nodeid, reason in _unlisted_skips:
        terminalreporter.line(f"{nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unlisted_skips and in_ci() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
