"""One job per run directory through deploy/launch.sh (slow; issue 27, rows 3, 4, 5, 11): while
a job runs, a second launch on its run dir and a ``--resume`` of it are refused at once naming
the live launcher's pid; after it ends, ``--resume`` with a smaller ``prompts_per_step`` and a
new ``lr`` completes with the audit clean and the new lr in the metrics; every file the job
wrote is private to the user."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from hybridflow.coordinator.metrics import read_step_lines
from hybridflow.deploy.run_lock import read_holder
from tests.fault.harness import audit, finish, launch

SETS = (
    "coordinator.num_steps=6",
    "coordinator.prompts_per_step=8",
    "coordinator.group_size=4",
    "coordinator.data_size=24",
    "coordinator.checkpoint_every=2",
    "coordinator.progress=false",
    "coordinator.save_checkpoint=false",
)


def _sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


@pytest.mark.slow
def test_live_run_dir_is_refused_then_resumed_with_changes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = launch(run, "--run-dir", str(run), *_sets(*SETS))
    deadline = time.monotonic() + 60
    while (holder := read_holder(run)) is None or holder.pid != first.pid:
        assert first.poll() is None and time.monotonic() < deadline, "the lock was never taken"
        time.sleep(0.05)  # another process's file: nothing to wait on locally
    for argv in (["--run-dir", str(run), *_sets(*SETS)], ["--resume", str(run)]):
        start = time.monotonic()
        code, out = finish(launch(run, *argv), 30)
        elapsed = time.monotonic() - start
        assert code == 2 and f"pid {first.pid} on" in out, out
        assert elapsed < 5.0, elapsed  # < 1 s on an idle machine; the services are starting
        assert first.poll() is None, "the refused launch disturbed the live one"
    code, out = finish(first, 600)
    assert code == 0, out

    changes = (
        "coordinator.num_steps=10",
        "coordinator.prompts_per_step=4",
        "learner.optimizer.lr=0.001",
    )
    code, out = finish(launch(run, "--resume", str(run), *_sets(*changes)), 600)
    assert code == 0, out
    audit(run, 10, {s: 8 if s <= 6 else 4 for s in range(1, 11)})
    metrics = read_step_lines(run / "metrics.jsonl")
    assert [m["actor/lr"] for m in metrics] == [2e-4] * 6 + [1e-3] * 4

    loose = [
        (str(p.relative_to(run)), oct(stat.S_IMODE(p.lstat().st_mode)))
        for p in [run, *run.rglob("*")]
        if stat.S_IMODE(p.lstat().st_mode) & 0o077
    ]
    assert not loose, loose
