"""The sandbox pool (``hybridflow/sandbox/pool.py``) on real bubblewrap: slots run programs
at once, each slot's process limit is its own, the queue is bounded, and a slot runs program
after program (nothing a run leaves behind counts against the next)."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hybridflow.sandbox import SandboxLimits
from hybridflow.sandbox.bubblewrap import BubblewrapSandbox
from hybridflow.sandbox.config import SandboxConfig
from hybridflow.sandbox.factory import pool_from_config
from hybridflow.sandbox.pool import PoolClosed, PoolFull, SandboxPool, slot_uid

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
)
LIMITS = SandboxLimits(wall_s=30, cpu_s=5, memory_bytes=256 * 1024 * 1024, processes=8)


def test_a_slot_runs_many_more_programs_than_its_process_limit():
    # bwrap's own init was left a zombie by every run; where pid 1 does not reap (a
    # container), they counted against the uid's process limit: run 8 of 8 failed to fork.
    sandbox = BubblewrapSandbox(uid=slot_uid(0))
    outcomes = [
        sandbox.run(
            ["python3", "-I", "-c", "import os; os.wait() if os.fork() else None"], {}, LIMITS
        )
        for _ in range(4 * LIMITS.processes)
    ]
    assert [r.outcome for r in outcomes] == ["ok"] * len(outcomes), outcomes[-1].stderr


def test_slots_run_at_once_and_each_has_its_own_process_limit():
    """Slot 0's program holds its whole process limit (children blocked on a pipe) while slot
    1's forks a child: under one uid for both slots that fork fails."""
    config = SandboxConfig(workers=2, processes=8, wall_s=60)
    pool = pool_from_config(config)
    hog = (
        "import os, time\nr, w = os.pipe()\nforked = 0\n"
        "while True:\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        os.close(w); os.read(r, 1); os._exit(0)\n"
        "    forked += 1\n"
        "open('/box/full', 'w').write(str(forked))\n"
        "while not os.path.exists('/box/go'):\n    time.sleep(0.01)\n"
    )
    try:
        held = pool.submit(["python3", "-I", "p.py"], {"p.py": hog}, config.limits())
        full = wait_for(lambda: glob.glob(f"{tempfile.gettempdir()}/hybridflow-sandbox-*/full"))
        assert int(Path(full[0]).read_text() or 0) >= config.processes - 2  # the limit is held
        forker = "import subprocess\nprint(subprocess.run(['true']).returncode)"
        result = pool.run(["python3", "-I", "p.py"], {"p.py": forker}, config.limits())
        Path(full[0]).with_name("go").touch()
        assert (result.outcome, result.stdout) == ("ok", b"0\n"), result.stderr
        assert held.result(timeout=60).outcome == "ok"
    finally:
        pool.close()


def wait_for(found, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (value := found()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return value


class _Gate:
    """A fake sandbox whose runs wait until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.started = threading.Semaphore(0)

    def run(self, argv, files, limits, stdin=b""):
        self.started.release()
        self.open.wait(60)
        from hybridflow.sandbox import SandboxResult

        return SandboxResult("ok", 0, b"", b"", 0.0)


def test_the_queue_is_bounded_and_close_cancels_what_waits():
    gate = _Gate()
    pool = SandboxPool(lambda slot: gate, workers=2, max_queued=1)
    running = [pool.submit(["x"], {}, LIMITS) for _ in range(2)]
    assert gate.started.acquire(timeout=30) and gate.started.acquire(timeout=30)
    waiting = pool.submit(["x"], {}, LIMITS)  # the one place in the queue
    with pytest.raises(PoolFull, match="max_queued=1"):
        pool.submit(["x"], {}, LIMITS)
    assert pool.stats().num_refused == 1
    closer = threading.Thread(target=pool.close)
    closer.start()
    gate.open.set()
    closer.join(60)
    assert [f.result().outcome for f in running] == ["ok", "ok"]
    assert waiting.cancelled() or waiting.result().outcome == "ok"
    with pytest.raises(PoolClosed):
        pool.submit(["x"], {}, LIMITS)


def test_slot_uids_differ_between_slots_and_processes():
    assert slot_uid(0, pid=10) != slot_uid(1, pid=10)
    assert slot_uid(0, pid=10) != slot_uid(0, pid=11)
    assert max(slot_uid(255, pid=2**22 - 1), slot_uid(0, os.getpid())) < 2**31 - 1
