"""scripts/gpu_check.sh: on a machine without CUDA it refuses up front (exit 2, nothing run) and
says what is missing and what to install; with a stand-in interpreter that answers like a GPU
machine, it runs every step (each file of tests/gpu, the engine benchmark, the learning run)
under ``set -u`` with nothing but PATH in its environment, from any directory, and prints one
table, failing steps included."""

from __future__ import annotations

import importlib.metadata
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
GPU_TEST_FILES = sorted(p.stem for p in (REPO / "tests" / "gpu").glob("test_*.py"))


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The script from ``tmp_path`` (not the repo root), with PATH and ``env`` only."""
    return subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_refuses_without_a_cuda_device_naming_what_to_install(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # CUDA_VISIBLE_DEVICES="" hides any GPU: the refusal shows on a GPU machine too.
    done = run(tmp_path, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="", GPU_CHECK_OUT=str(out))
    print(done.stderr)
    assert done.returncode == 2
    assert done.stdout == "" and not out.exists()  # nothing ran
    assert done.stderr.startswith("gpu_check: refused, nothing was run:\n  - no CUDA device: ")
    assert "make setup DEVICE=cuda" in done.stderr and "CUDA 13.0" in done.stderr
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        assert "the vllm CUDA build is missing" in done.stderr
    assert "unbound variable" not in done.stderr


def test_refuses_without_the_interpreter(tmp_path: Path) -> None:
    done = run(tmp_path, PYTHON=str(tmp_path / "no-python"))
    assert done.returncode == 2
    assert f"no Python at PYTHON={tmp_path / 'no-python'}" in done.stderr


FAKE_PYTHON = r"""#!/usr/bin/env bash
# Answers gpu_check.sh like a CUDA machine's interpreter, in no time.
case "$*" in
  -) cat >/dev/null; echo "1 x Fake GPU; torch 2.13.0 (CUDA 13.0), vllm 0.32.0" ;;
  "- "*) exec "$REAL_PYTHON" "$@" ;;  # the table's figure helpers
  "-m pytest"*)
    if [[ "$*" == *"$FAIL_FILE"* ]]; then echo "1 failed, 2 passed in 3.2s"; exit 1; fi
    echo "3 passed in 41.2s" ;;
  *run_engines.py*)
    while [[ $1 != --results ]]; do shift; done
    results=$2
    mkdir -p "$results/engines_1"
    echo '{"models": {"100m": {"workloads": {"64 seqs, 256 tok": {"hf_tokens_per_s": 900,
      "vllm_tokens_per_s": 45000, "vllm_over_hf": 50.0}}}}}' >"$results/engines_1/summary.json" ;;
  *hybridflow.deploy.launch*)
    while [[ $1 != --run-dir ]]; do shift; done
    run_dir=$2
    mkdir -p "$run_dir"
    echo '{"reward_start": 0.1, "reward_end": 0.9}' >"$run_dir/summary.json" ;;
  *) echo "fake python: unexpected $*" >&2; exit 9 ;;
esac
"""


@pytest.mark.parametrize("fail_file", ["", "test_vllm_cuda"])
def test_runs_every_step_and_prints_one_table(tmp_path: Path, fail_file: str) -> None:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    done = run(
        tmp_path,
        PYTHON=str(fake),
        REAL_PYTHON=sys.executable,
        FAIL_FILE=fail_file or "none",
        GPU_CHECK_OUT=str(out),
        GPU_CHECK_STEPS="7",
    )
    print(done.stdout, done.stderr)
    assert "unbound variable" not in done.stderr
    table = done.stdout.split("== gpu_check: results")[1].splitlines()[1:]
    assert table[0].split() == ["step", "result", "figure", "seconds"]
    # fixed columns: step 46, result 12, figure 72, seconds
    rows = {
        line[:46].strip(): (line[48:60].strip(), line[62:134].strip(), line[136:].strip())
        for line in table[1:]
    }
    expected = ["preflight", *(f"gpu tests: {f.removeprefix('test_')}" for f in GPU_TEST_FILES)]
    expected += ["engine benchmark (cuda)", "quickstart, vllm + FSDP2 on cuda, 7 steps"]
    assert list(rows) == expected
    for file in GPU_TEST_FILES:
        result, figure, seconds = rows[f"gpu tests: {file.removeprefix('test_')}"]
        if file == fail_file:
            assert (result, figure) == ("FAIL (1)", "1 failed, 2 passed")
        else:
            assert (result, figure) == ("ok", "3 passed")
        assert seconds.isdigit() and (out / f"{file}.log").is_file()
    assert rows["engine benchmark (cuda)"][:2] == (
        "ok",
        "100m 64 seqs, 256 tok: vllm 45000 tok/s, hf 900 (x50.0)",
    )
    assert rows["quickstart, vllm + FSDP2 on cuda, 7 steps"][:2] == ("ok", "reward 0.100 -> 0.900")
    assert done.returncode == (1 if fail_file else 0)
