"""Session-wide test setup: one torch thread per process and the built-in tiny checkpoints.

``tiny_model_path`` (``tiny_rm_path``) copies ``builtin:tiny`` (``builtin:tiny-rm``) once per
session into the session's temp dir, or uses the persistent cache under ``$HYBRIDFLOW_HOME``
when that is set (fast repeated runs).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.fixture(autouse=True)
def _config_notices_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees its own config notices: the loader says each one once per process, so
    a test that checks a notice would otherwise pass or fail by which test ran before it."""
    try:
        from hybridflow.config import loader
    except ImportError:
        return
    monkeypatch.setattr(loader, "_noticed", set())


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


# The skip policy's hooks (tests/skips.py): every skip's reason checked, unlisted ones fail
# a CI run.
from tests.skips import (  # noqa: E402, F401
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
