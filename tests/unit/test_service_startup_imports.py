"""What a process imports before it is of use (issue 45's start-up): every entry point's
``--help`` answers without torch, transformers, vLLM or gRPC, and the reward service (which
scores with Python rules) comes up healthy on a real socket without ever loading torch.
Each check runs in a fresh interpreter: this test process has imported torch already."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for_file

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "vllm", "grpc")
ENTRY_POINTS = [
    "hybridflow.main.learner",
    "hybridflow.main.rollout",
    "hybridflow.main.reward",
    "hybridflow.main.environment",
    "hybridflow.main.coordinator",
    "hybridflow.deploy.launch",
    "hybridflow.loadgen.cli",
]

HELP = """
import runpy, sys
sys.argv = [{module!r}, "--help"]
try:
    runpy.run_module({module!r}, run_name="__main__")
except SystemExit as stop:
    code = stop.code
else:
    code = None
print("HEAVY", sorted(m for m in {heavy!r} if m in sys.modules), "EXIT", code, file=sys.stderr)
"""


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_answers_without_heavy_imports(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", HELP.format(module=module, heavy=HEAVY)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout, proc.stdout
    assert "HEAVY [] EXIT 0" in proc.stderr, proc.stderr


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_reward_service_is_healthy_without_torch(tmp_path: Path) -> None:
    from hybridflow.rpc.channel import wait_healthy

    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridflow.main.reward", "--config",
         "deploy/configs/quickstart.yaml", "--port-file", str(port_file)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_file(port_file, proc)
        wait_healthy(port_file.read_text().strip(), timeout_s=60)
        mapped = Path(f"/proc/{proc.pid}/maps").read_text()
        # a process that imported torch has its shared library mapped (libtorch_cpu.so)
        assert "libtorch" not in mapped
        assert "libc" in mapped  # the check reads a real map
    finally:  # the service ends here, failed assertions included
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
