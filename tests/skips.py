"""Which skips a test run may have, and the skips this machine allows.

A skip names its reason. Locked packages are imported plainly (a broken install fails the
test, it never turns into a skip). What may skip is a short, named list, each reason built by
one function here so that its text starts with a known prefix:

- ``no_gpu(what)``: the test needs a CUDA device and this machine has none;
- ``needs_root(what)``: the test needs root (mounts, network namespaces, Slurm daemons).

Under ``CI=true`` (``.ci/run`` sets it) any other skip fails the run: ``tests/conftest.py``
collects every skipped test and collection with its reason and, at the end, lists the ones
outside this list and sets a failing exit status. Outside CI they are printed like any skip
(``make test`` shows every reason).
"""

from __future__ import annotations

import os

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
