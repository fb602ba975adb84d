"""``python -m hybridflow.coordinator`` ends without the interpreter's teardown, keeping its
exit code and everything it printed or logged."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import logging, sys
from hybridflow.coordinator.cli import exit_fast
logging.basicConfig(stream=sys.stderr, level=logging.INFO)
sys.stdout.write("printed, not flushed")
logging.getLogger("x").info("logged")
exit_fast(3)
"""


def test_exit_fast_keeps_the_code_and_the_output():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3
    assert out.stdout == "printed, not flushed"
    assert "logged" in out.stderr


def test_the_command_line_exits_with_the_commands_code(tmp_path):
    # No coordinator at this run dir: the control command fails with 2, unchanged.
    out = subprocess.run(
        [sys.executable, "-m", "hybridflow.coordinator", "status", "--run-dir", str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "coordinator.addr not found" in out.stderr
