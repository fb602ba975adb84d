"""Kill harness: run deploy/launch.sh on the tiny model, SIGKILL one process of the run at a
chosen step, resume where the job cannot continue by itself, then audit what was trained.

The audit reads ``trained.jsonl`` (one line per trained group: step, epoch, prompt index,
hand-out seq, policy version) and the final checkpoint's list of prompts handed out and not
trained: every hand-out must be trained exactly once or still pending (0 lost, 0 doubled),
and no prompt may train twice within an epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hybridflow.coordinator.metrics import read_step_lines

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "deploy" / "launch.sh"

NUM_STEPS = 40
LAST_KILL_STEP = 8
"""Kills happen at steps 1..LAST_KILL_STEP of NUM_STEPS: the ~30 steps left after a kill take
seconds even on an idle machine (the whole 40-step run trains in ~4 s), far more than the
harness needs to see the step count and send the signal, so the run cannot finish first."""
PROMPTS_PER_STEP = 8
OVERRIDES = (
    f"coordinator.num_steps={NUM_STEPS}",
    f"coordinator.prompts_per_step={PROMPTS_PER_STEP}",
    "coordinator.group_size=4",
    "coordinator.data_size=24",
    "coordinator.checkpoint_every=2",
    "coordinator.progress=false",
    "coordinator.save_checkpoint=false",
    "coordinator.replica_rejoin_timeout_s=120",
)
# What each victim's command line contains (the launcher is launch.sh's python child).
VICTIMS = {
    "rollout": "hybridflow.main.rollout",
    "reward": "hybridflow.main.reward",
    "learner": "hybridflow.main.learner",
    "coordinator": "hybridflow.main.coordinator",
    "launcher": "hybridflow.deploy.launch",
}
PROCESS_OF = {**VICTIMS, "environment": "hybridflow.main.environment"}
"""Every service a trial may kill (the environment service runs in multi-turn jobs only)."""
RESUMED = ("learner", "coordinator", "launcher")
"""Victims after whose death the job stops and is continued with --resume."""


@dataclass
class Trial:
    victim: str
    kill_after_step: int
    run_dir: Path
    pids: set[int] = field(default_factory=set)
    exit_codes: list[int] = field(default_factory=list)
    output: str = ""
    extra: tuple[str, ...] = ()
    """Overrides after the harness's own (``--set`` values)."""
    hold_dir: Path | None = None
    """With ``tests/fault/multi_turn_env.py``: once the step is reached, hold the episodes'
    steps and kill only when one is held (mid-episode for certain), then let them go."""


def launch(run_dir: Path, *extra: str, hold_dir: Path | None = None) -> subprocess.Popen[bytes]:
    args = [str(LAUNCH), *extra]
    env = dict(os.environ, PYTHON=sys.executable)
    if hold_dir is not None:
        env["HYBRIDFLOW_TEST_HOLD_DIR"] = str(hold_dir)
    env.pop("HYBRIDFLOW_TOKEN", None)  # the launcher makes a per-run token, as for a user
    return subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, str]:
    """(exit status, output) of a ``launch``; past ``timeout_s`` its process group is killed
    (the launcher takes its services with it) before the timeout propagates."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out.decode(errors="replace")


def process_tree(pid: int) -> dict[int, str]:
    """pid and its descendants with their command lines (Linux /proc)."""
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            cmdline = Path(f"/proc/{current}/cmdline").read_bytes().replace(b"\0", b" ")
            out[current] = cmdline.decode(errors="replace")
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def trained_steps(run_dir: Path) -> int:
    return len(read_step_lines(run_dir / "metrics.jsonl"))  # evaluations' lines left out


def run_trial(trial: Trial, timeout_s: float = 300.0) -> None:
    """Launch, kill the victim once ``kill_after_step`` steps are trained, finish the run."""
    deadline = time.monotonic() + timeout_s
    if trial.hold_dir is not None:
        trial.hold_dir.mkdir(parents=True, exist_ok=True)
    proc = launch(
        trial.run_dir, "--run-dir", str(trial.run_dir), *_sets(trial.extra), hold_dir=trial.hold_dir
    )
    victim_pid = None
    while victim_pid is None:
        if proc.poll() is not None:
            raise AssertionError(f"run ended before the kill:\n{_read(proc)}")
        if time.monotonic() > deadline:
            _kill_tree(proc)
            raise AssertionError(f"step {trial.kill_after_step} not reached in time")
        tree = process_tree(proc.pid)
        trial.pids.update(tree)
        if trained_steps(trial.run_dir) >= trial.kill_after_step:
            victim_pid = next(
                (
                    p
                    for p, cmd in tree.items()
                    if PROCESS_OF[trial.victim] in cmd and "bash" not in cmd
                ),
                None,
            )
            if victim_pid is not None and _held(trial.hold_dir, proc, deadline):
                break  # kill at once
        time.sleep(0.05)  # polling another process's files: nothing to wait on locally
    try:
        os.kill(victim_pid, signal.SIGKILL)
    except ProcessLookupError:
        raise AssertionError(
            f"{trial.victim} (pid {victim_pid}) ended before the kill at step "
            f"{trial.kill_after_step}:\n{_read(proc)}"
        ) from None
    finally:
        if trial.hold_dir is not None:
            (trial.hold_dir / "hold").unlink(missing_ok=True)  # the episodes go on
    trial.exit_codes.append(_wait(proc, deadline, trial))
    if trial.victim in RESUMED:
        _wait_gone(trial.pids, deadline)  # nothing of the first attempt may linger
        proc = launch(trial.run_dir, "--resume", str(trial.run_dir))
        trial.exit_codes.append(_wait(proc, deadline, trial))
    _wait_gone(trial.pids, deadline)


def _held(hold_dir: Path | None, proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """True once an episode's step is held (at once without a ``hold_dir``)."""
    if hold_dir is None:
        return True
    (hold_dir / "hold").touch()
    while not any(hold_dir.glob("held-*")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no episode step was held before the kill:\n{_read(proc)}")
        time.sleep(0.01)  # another process's files: nothing to wait on locally
    return True


def audit(
    run_dir: Path, num_steps: int = NUM_STEPS, per_step: int | Mapping[int, int] = PROMPTS_PER_STEP
) -> dict:
    """Counts of the audit; raises AssertionError on a lost or doubled prompt. ``per_step``:
    groups trained at every step, or by step (a resume that changed prompts_per_step).
    Groups dynamic sampling filtered count as consumed, not as trained in their step."""
    trained = [json.loads(x) for x in (run_dir / "trained.jsonl").read_text().splitlines()]
    steps = Counter(r["step"] for r in trained if not r.get("filtered"))
    if isinstance(per_step, int):
        per_step = {s: per_step for s in range(1, num_steps + 1)}
    assert steps == Counter(per_step), steps
    per_epoch = Counter((r["epoch"], r["index"]) for r in trained)
    doubled = [k for k, n in per_epoch.items() if n > 1]
    assert not doubled, f"trained twice in one epoch: {doubled}"
    seqs = Counter(r["seq"] for r in trained)
    final = json.loads(
        (run_dir / "checkpoints" / f"step_{num_steps:08d}" / "coordinator.json").read_text()
    )
    pending = {seq for _, _, seq in final["pending"]}
    assert not pending & set(seqs), "a pending prompt was also trained"
    handed_out = set(seqs) | pending
    lost = set(range(max(handed_out) + 1)) - handed_out
    assert not lost, f"hand-outs neither trained nor pending: {sorted(lost)}"
    return {
        "trained": len(trained),
        "pending": len(pending),
        "lost": len(lost),
        "doubled": len(doubled),
    }


def _sets(extra: tuple[str, ...] = ()) -> list[str]:
    out = []
    for o in (*OVERRIDES, *extra):
        out += ["--set", o]
    return out


def _wait(proc: subprocess.Popen[bytes], deadline: float, trial: Trial) -> int:
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        raise AssertionError(f"run did not finish in time:\n{_read(proc)}") from None
    trial.output += _read(proc)
    return code


def _wait_gone(pids: set[int], deadline: float) -> None:
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in pids if alive(p)}
            raise AssertionError(f"processes left behind: {left}")
        time.sleep(0.2)


def _read(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    return proc.stdout.read().decode(errors="replace")


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    for pid in process_tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
