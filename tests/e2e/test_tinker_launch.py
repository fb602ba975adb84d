"""deploy/launch.sh runs a Tinker-compatible service job (``tinker.enabled``) as its only
process: the run's token is its API key, its address lands in the run dir, the official SDK
trains through it, and a stop signal ends it (exit 130) with its journal kept; a second
launch on the same run dir (``--resume``) has the model and its steps back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "deploy" / "launch.sh"


def _start(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    cmd = [str(LAUNCH), "--config", "deploy/configs/tinker.yaml", "--set", "tinker.port=0", *args]
    env = dict(os.environ, PYTHON=sys.executable, TINKER_TELEMETRY="0", HF_HUB_OFFLINE="1")
    env.pop("HYBRIDFLOW_TOKEN", None)
    return subprocess.Popen(cmd, cwd=REPO, env=env, text=True, start_new_session=True)


def _address(run_dir: Path, proc: subprocess.Popen[str]) -> str:
    path = run_dir / "tinker.addr"
    deadline = time.monotonic() + 300
    while not path.exists():
        assert proc.poll() is None, f"the launch exited with {proc.returncode}"
        assert time.monotonic() < deadline, "no tinker.addr in the run dir"
        time.sleep(0.2)
    return "http://" + path.read_text().strip()


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=120)


def _step(client: tinker.TrainingClient) -> float:
    tokens = np.arange(5, 25).tolist()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 19},
    )
    out = client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return float(out.metrics["loss:sum"])


@pytest.mark.usefixtures("tiny_model_path")
def test_launch_serves_the_sdk_and_a_resumed_run_has_its_models(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "--run-dir", str(run_dir))
    try:
        url = _address(run_dir, proc)
        key = "tml-" + (run_dir / "token").read_text().strip()
        service = tinker.ServiceClient(base_url=url, api_key=key)
        client = service.create_lora_training_client(
            base_model="builtin:tiny-qwen3", rank=4
        ).result()
        losses = [_step(client) for _ in range(3)]
        assert losses[-1] < losses[0]
        path = client.save_state("three").result().path
    finally:
        code = _stop(proc)
    assert code == 130
    assert (run_dir / "tinker" / "journal.jsonl").stat().st_size > 0

    (run_dir / "tinker.addr").unlink()
    again = _start(run_dir, "--resume", str(run_dir))
    try:
        url = _address(run_dir, again)
        service = tinker.ServiceClient(base_url=url, api_key=key)
        resumed = service.create_training_client_from_state_with_optimizer(path).result()
        assert _step(resumed) < losses[-1]  # it goes on from step 3
    finally:
        assert _stop(again) == 130
