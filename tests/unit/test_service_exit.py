"""A service's ``python -m`` entry ends through ``exit_service``: its exit code, its atexit
handlers and everything it printed or logged are kept; the interpreter's teardown is not."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import atexit, logging, sys
from hybridflow.utils.fast_exit import exit_service
logging.basicConfig(stream=sys.stderr, level=logging.INFO)
atexit.register(lambda: print("atexit ran", file=sys.stderr))
class Teardown:
    def __del__(self):
        print("torn down", file=sys.stderr)
kept = Teardown()
sys.stdout.write("printed, not flushed")
logging.getLogger("x").info("logged")
exit_service(3)
"""


def test_exit_service_keeps_the_code_the_output_and_the_atexit_handlers():
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
    assert "atexit ran" in out.stderr
    assert "torn down" not in out.stderr  # no module teardown: objects are not finalised
