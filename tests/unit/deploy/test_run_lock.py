"""One job per run directory (issue 27, row 4): the run dir's lock is exclusive, names its
holder, is released when the holder dies (SIGKILL included), and the launcher refuses a
second launch or a ``--resume`` of a live run at once, before the preflight, naming the pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from hybridflow.deploy.launch import main
from hybridflow.deploy.run_lock import (
    RunDirBusy,
    acquire_unless_parent_holds,
    lock_run_dir,
    read_holder,
)

from .test_launch_args import CONFIG, previous_run

REPO = Path(__file__).resolve().parents[3]
HOLD = (
    "import sys, time; from pathlib import Path; "
    "from hybridflow.deploy.run_lock import lock_run_dir; "
    "lock = lock_run_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)"
)


@pytest.fixture
def keep_umask():  # type: ignore[no-untyped-def]
    """The launcher sets the process umask; the test process gets its own back."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def _hold_in_child(run_dir: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_second_lock_is_refused_naming_the_holder_and_freed_by_sigkill(tmp_path: Path) -> None:
    child = _hold_in_child(tmp_path)
    try:
        with pytest.raises(RunDirBusy, match=f"pid {child.pid} on {socket.gethostname()}"):
            lock_run_dir(tmp_path)
        holder = read_holder(tmp_path)
        assert holder is not None and holder.pid == child.pid
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    lock = lock_run_dir(tmp_path)  # the kernel dropped the dead holder's lock
    assert read_holder(tmp_path) == lock.holder and lock.holder.pid == os.getpid()
    lock.release()
    lock_run_dir(tmp_path).release()


def test_lock_is_exclusive_within_one_process_too(tmp_path: Path) -> None:
    lock = lock_run_dir(tmp_path)
    with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
        lock_run_dir(tmp_path)
    lock.release()


def test_a_child_of_the_holder_goes_on_and_a_stranger_is_refused(tmp_path: Path) -> None:
    lock = lock_run_dir(tmp_path)  # this process plays the launcher
    code = (
        "import sys; from pathlib import Path; "
        "from hybridflow.deploy.run_lock import acquire_unless_parent_holds; "
        "print(acquire_unless_parent_holds(Path(sys.argv[1])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.stdout.strip() == "None"  # the coordinator under its launcher
    lock.release()
    child = _hold_in_child(tmp_path)  # a job that is not this process's parent
    try:
        with pytest.raises(RunDirBusy):
            acquire_unless_parent_holds(tmp_path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_lock_file_is_not_inherited_by_children(tmp_path: Path) -> None:
    lock = lock_run_dir(tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.release()  # the holder ends; a child it started must not keep the run locked
        again = lock_run_dir(tmp_path)  # raises RunDirBusy if the child held it
        assert sleeper.poll() is None  # the child is still alive while the lock is retaken
        again.release()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.usefixtures("keep_umask")
@pytest.mark.parametrize("how", ["run-dir", "resume", "resume-while-starting"])
def test_launcher_refuses_a_live_run_dir_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    run_dir = previous_run(tmp_path / "run", [])
    if how == "resume-while-starting":  # its coordinator has not written config.yaml yet
        (run_dir / "config.yaml").unlink()
    launches_before = (run_dir / "launch.json").read_text()
    child = _hold_in_child(run_dir)
    try:
        argv = ["--run-dir", str(run_dir)] if how == "run-dir" else ["--resume", str(run_dir)]
        start = time.monotonic()
        assert main(["--config", CONFIG, *argv] if how == "run-dir" else argv) == 2
        elapsed = time.monotonic() - start
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"pid {child.pid} on {socket.gethostname()}" in err[0], err
    assert elapsed < 1.0, elapsed
    assert (run_dir / "launch.json").read_text() == launches_before  # nothing recorded


@pytest.mark.usefixtures("keep_umask")
def test_launcher_refuses_a_resume_the_checkpoint_cannot_honour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hybridflow.coordinator.job import TrainingJob
    from hybridflow.coordinator.services import Services
    from hybridflow.job_config import load_job_config
    from tests.unit.coordinator.fakes import FakeLearner, FakeReward, FakeRollout, records

    run_dir = previous_run(tmp_path / "run", [])
    job = load_job_config(  # the job by hand, without the held-out sets the coordinator loads
        CONFIG,
        ["coordinator.num_steps=2", "coordinator.progress=false", "coordinator.eval.sets=[]"],
    )
    root = run_dir / "checkpoints"
    rollouts = [FakeRollout()]
    svc = Services(rollouts, FakeReward(), FakeLearner(rollouts, root), ["r0"], lambda ids: "")
    TrainingJob(
        job.coordinator,
        svc,
        records(64),
        run_dir,
        checkpoint_root=root,
        resolved_config=asdict(job),
    ).run()  # a checkpoint of step 2 with its manifest, as the fake learner writes one
    launches_before = (run_dir / "launch.json").read_text()
    argv = ["--resume", str(run_dir), "--set", "coordinator.seed=7"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "coordinator.seed 0 -> 7" in err[0], err
    assert (run_dir / "launch.json").read_text() == launches_before  # not kept for later
