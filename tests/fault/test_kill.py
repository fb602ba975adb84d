"""SIGKILL each process of a run at some step; the run completes (after --resume where the
learner, coordinator or launcher died) with 0 prompts lost, 0 trained twice per epoch, and no
process left. The default suite kills each service once (the launcher and the coordinator
once in ``-m slow``); ``-m slow`` runs 5 seeded trials each."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.fault.harness import LAST_KILL_STEP, RESUMED, VICTIMS, Trial, audit, run_trial


def _check(trial: Trial) -> None:
    run_trial(trial)
    if trial.victim in RESUMED:
        assert trial.exit_codes[0] != 0 and trial.exit_codes[1] == 0, trial.output
        if trial.victim != "launcher":  # the launcher itself cannot say anything: it is dead
            assert "--resume" in trial.output, trial.output
    else:
        assert trial.exit_codes == [0], trial.output
    counts = audit(trial.run_dir)
    assert counts["lost"] == 0 and counts["doubled"] == 0


# The launcher's and the coordinator's deaths are slow here: both resume like the learner's,
# and a launcher SIGKILL leaving no process is tests/fault/test_supervision.py's.
ONCE = [
    pytest.param(v, marks=pytest.mark.slow) if v in ("launcher", "coordinator") else v
    for v in VICTIMS
]


@pytest.mark.parametrize("victim", ONCE)
def test_kill_once(victim: str, tmp_path: Path) -> None:
    _check(Trial(victim, 3, tmp_path / victim))


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(5))
@pytest.mark.parametrize("victim", list(VICTIMS))
def test_kill_at_random_moments(victim: str, trial: int, tmp_path: Path) -> None:
    step = random.Random(f"{victim}-{trial}").randint(1, LAST_KILL_STEP)
    _check(Trial(victim, step, tmp_path / victim))


ASYNC = ("coordinator.max_staleness=2", "learner.loss.off_policy=tis")
"""An async run: each step goes to the learner while the one before it trains
(``coordinator.train_ahead``), so a death can leave a step sent ahead in flight."""


@pytest.mark.parametrize(
    "victim", ["learner", pytest.param("coordinator", marks=pytest.mark.slow), "rollout"]
)
def test_kill_once_in_an_async_run(victim: str, tmp_path: Path) -> None:
    _check(Trial(victim, 3, tmp_path / victim, extra=ASYNC))
