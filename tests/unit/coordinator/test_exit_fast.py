"""``python -m hybridflow.main.coordinator`` ends through ``exit_service`` (tested in
tests/unit/test_service_exit.py) and keeps its commands' exit codes."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_command_line_exits_with_the_commands_code(tmp_path):
    # No coordinator at this run dir: the control command fails with 2, unchanged.
    out = subprocess.run(
        [sys.executable, "-m", "hybridflow.main.coordinator", "status", "--run-dir", str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "coordinator.addr not found" in out.stderr
