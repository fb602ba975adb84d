"""``IpcLedger.release`` (services/ipc.py) leaves nothing in /dev/shm, whoever in the process
tree made it: a segment and a semaphore of this process, and a segment of a spawned child that
is still running (as a vLLM worker would be), all without running their owners' finalisers.
Runs in a fresh interpreter: the ledger patches and stops that process's resource tracker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp, sys, time
    from multiprocessing import shared_memory
    from hybridflow.services.ipc import IpcLedger

    def child(q):
        seg = shared_memory.SharedMemory(create=True, size=1 << 16)
        q.put(seg.name)
        time.sleep(600)  # a worker that would outlive its parent

    if __name__ == "__main__":
        ledger = IpcLedger.install()
        ctx = mp.get_context("spawn")
        mine = shared_memory.SharedMemory(create=True, size=1 << 20)
        sem = ctx.Lock()
        q = ctx.Queue()
        proc = ctx.Process(target=child, args=(q,), daemon=True)
        proc.start()
        theirs = q.get(timeout=120)
        print(mine.name, theirs, sem._semlock.name, flush=True)
        ledger.release(grace_s=10)
        print("released", flush=True)
        import os
        os._exit(0)  # no finaliser, no atexit: only release() may have cleaned
    """
)


def test_release_unlinks_own_and_childrens_segments_and_semaphores(tmp_path: Path) -> None:
    script = tmp_path / "leaky.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, check=True
    ).stdout.split()
    mine, theirs, sem = out[:3]
    assert out[3] == "released"
    shm = Path("/dev/shm")
    assert not (shm / mine).exists() and not (shm / theirs).exists()
    assert not (shm / f"sem.{sem.lstrip('/')}").exists()
