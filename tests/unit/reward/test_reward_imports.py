"""The reward service scores text with rules: its process must not load torch,
transformers or numpy (seconds of start time and hundreds of MB, or ~12 MB for numpy, for
nothing). Checked on the real start path: the entry module's ``main`` with the quickstart
config, and one Score call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Runs the service's main() as `python -m hybridflow.main.reward` would, but replaces the
# serve-forever loop: one Score call, a check of what was loaded, then stop.
SCRIPT = """
import sys
import hybridflow.rpc.server as server

def check_then_stop(running, grace_s, on_stop=None, stop=None):
    from hybridflow.services.reward.client import GrpcRewardClient
    from hybridflow.types import ScoreItem

    client = GrpcRewardClient(running.address)
    results = client.score_batch([ScoreItem("arith", "42", "42"), ScoreItem("gsm8k", "#### 7", "7")])
    client.close()
    print("SCORES", [r.score for r in results], flush=True)
    heavy = sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)
    print("HEAVY", heavy, flush=True)
    running.stop(0)
    if on_stop is not None:
        on_stop()

server.serve_until_signal = check_then_stop
from hybridflow.main.reward import main
sys.exit(main(["--config", "deploy/configs/quickstart.yaml"]))
"""


def test_reward_service_start_loads_no_torch_transformers_or_numpy():
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "SCORES [1.0, 1.0]" in lines, (out.stdout, out.stderr)
    assert "HEAVY []" in lines, (out.stdout, out.stderr)
