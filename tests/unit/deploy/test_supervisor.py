"""Supervisor decisions against real fake children and a scripted clock: restarts with a
doubling backoff and a budget, the job stopped on a learner / coordinator death, and the
bounded stop on request. Times asserted are the injected clock's, never wall-clock."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from hybridflow.deploy.supervisor import EXIT_REFUSED, EventLog, Outcome, Supervisor
from tests.unit.deploy.fakes import FakeGroup, Script, child, exit_with

BIG = 1e6  # a stop timeout that a fake child's exit on SIGTERM always beats


@pytest.fixture
def group(tmp_path):
    g = FakeGroup(tmp_path)
    for name in ("reward", "learner", "rollout0"):
        g.add(name)
    yield g
    g.close()


def make(group: FakeGroup, coordinator, tmp_path: Path, **kw) -> tuple[Supervisor, Script]:
    script = Script()
    script.max_time = 2 * BIG
    sup = Supervisor(
        group,
        coordinator,
        EventLog(tmp_path / "supervisor.jsonl", wall_clock=script.clock),
        clock=script.clock,
        sleep=script.sleep,
        **kw,
    )
    return sup, script


def read_events(tmp_path: Path) -> list[dict]:
    lines = (tmp_path / "supervisor.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def times(events: list[dict], service: str, event: str) -> list[float]:
    return [e["time"] for e in events if e["service"] == service and e["event"] == event]


def test_coordinator_that_finishes_ends_the_job_cleanly(group, tmp_path):
    coordinator = child()
    sup, script = make(group, coordinator, tmp_path)
    script.at(1.0, lambda: exit_with(coordinator, 0))
    assert sup.run() == Outcome(0)
    assert group.restarts == []
    assert all(p.popen.poll() is None for p in group.processes)  # stopping them is the caller's


def test_reward_is_restarted_with_doubling_backoff_until_its_budget_is_spent(group, tmp_path):
    coordinator = child()
    sup, script = make(
        group, coordinator, tmp_path, restart_budget=3, restart_backoff_s=1.0, stop_timeout_s=BIG
    )
    for t, code in ((1.0, 5), (5.0, 6), (12.0, 7), (30.0, 8)):
        script.at(t, lambda code=code: exit_with(group.get("reward").popen, code))
    outcome = sup.run()
    reward_log = tmp_path / "reward.log"
    assert outcome == Outcome(
        1, f"reward exited with code 8 (see {reward_log}); restart budget (3) spent"
    )
    assert group.restarts == ["reward"] * 3
    events = read_events(tmp_path)
    exited, restarting = times(events, "reward", "exited"), times(events, "reward", "restarting")
    assert [
        e["exit_code"] for e in events if e["event"] == "exited" and e["service"] == "reward"
    ] == [5, 6, 7, 8]
    # Backoff 1, 2, 4 s after each exit, within one poll.
    for died, spawned, delay in zip(exited, restarting, (1.0, 2.0, 4.0), strict=False):
        assert died + delay - 1e-9 <= spawned < died + delay + sup.poll_s + 1e-9
    restarted = [e for e in events if e["event"] == "restarted"]
    assert [e["attempt"] for e in restarted] == [1, 2, 3]
    assert [e["event"] for e in events][-4:] == ["gave_up", "failed", "sigterm", "exited"]
    assert coordinator.returncode == -signal.SIGTERM  # asked to stop, not killed
    assert group.get("learner").popen.poll() is None and group.get("rollout0").popen.poll() is None


def test_learner_death_kills_the_coordinator_at_once(group, tmp_path):
    coordinator = child("ignore-term")
    sup, script = make(group, coordinator, tmp_path, stop_timeout_s=BIG)
    script.at(1.0, lambda: exit_with(group.get("learner").popen, 9))
    outcome = sup.run()
    assert outcome == Outcome(1, f"learner exited with code 9 (see {tmp_path / 'learner.log'})")
    assert coordinator.returncode == -signal.SIGKILL
    assert group.restarts == []
    (killed,) = times(read_events(tmp_path), "coordinator", "sigkill")
    assert killed < 1.0 + sup.poll_s + 1e-9


def test_a_failed_coordinator_is_blamed_on_the_service_that_died_first(group, tmp_path):
    coordinator = child()

    def both() -> None:
        exit_with(group.get("learner").popen, 1)
        exit_with(coordinator, 1)

    sup, script = make(group, coordinator, tmp_path)
    script.at(1.0, both)
    assert sup.run().cause == f"learner exited with code 1 (see {tmp_path / 'learner.log'})"
    kinds = [(e["service"], e["event"]) for e in read_events(tmp_path)]
    assert ("learner", "exited") in kinds and ("job", "failed") in kinds, kinds


def test_a_failed_coordinator_is_the_cause_when_the_services_live(group, tmp_path):
    coordinator = child()
    sup, script = make(group, coordinator, tmp_path)
    script.at(1.0, lambda: exit_with(coordinator, 3))
    assert sup.run() == Outcome(1, "coordinator exited with code 3")


def test_a_coordinator_that_refuses_the_job_ends_it_without_a_cause(group, tmp_path):
    """Exit 2: bad input or a resume the checkpoint cannot honour. Its own line says why;
    the launcher adds no resume hint, since a resume would be refused the same."""
    coordinator = child()
    sup, script = make(group, coordinator, tmp_path)
    script.at(1.0, lambda: exit_with(coordinator, EXIT_REFUSED))
    assert sup.run() == Outcome(EXIT_REFUSED)


def test_stop_request_sigterms_then_kills_after_the_timeout(group, tmp_path):
    coordinator = child("ignore-term")  # blocked: never finishes its step
    sup, script = make(group, coordinator, tmp_path, stop_timeout_s=5.0)
    script.at(1.0, sup.request_stop)
    outcome = sup.run()
    assert outcome == Outcome(1, "coordinator killed: did not stop within 5s", True)
    events = read_events(tmp_path)
    (term,) = times(events, "coordinator", "sigterm")
    (kill,) = times(events, "coordinator", "sigkill")
    assert term + 5.0 - 1e-9 <= kill < term + 5.0 + sup.poll_s + 1e-9


def test_second_stop_request_kills_at_once(group, tmp_path):
    coordinator = child("ignore-term")
    sup, script = make(group, coordinator, tmp_path, stop_timeout_s=BIG)
    script.at(1.0, sup.request_stop)
    script.at(2.0, sup.request_stop)
    assert sup.run().cause == "coordinator killed: second stop request"
    (kill,) = times(read_events(tmp_path), "coordinator", "sigkill")
    assert 2.0 <= kill < 2.0 + sup.poll_s + 1e-9


def test_clean_stop_on_request(group, tmp_path):
    coordinator = child("term-exits-0")  # like the real one: finishes its step, saves, exits 0
    sup, script = make(group, coordinator, tmp_path, stop_timeout_s=BIG)
    script.at(1.0, sup.request_stop)
    assert sup.run() == Outcome(0, None, stopped_by_request=True)


def test_services_that_die_while_stopping_are_not_restarted(group, tmp_path):
    coordinator = child("ignore-term")
    sup, script = make(group, coordinator, tmp_path, stop_timeout_s=5.0)
    script.at(1.0, sup.request_stop)
    script.at(2.0, lambda: exit_with(group.get("reward").popen, 1))
    sup.run()
    assert group.restarts == []


def test_restart_that_cannot_bind_its_port_says_so(group, tmp_path):
    coordinator = child()
    group.ready = False
    sup, script = make(
        group, coordinator, tmp_path, restart_budget=1, restart_backoff_s=0.0, stop_timeout_s=BIG
    )
    original = group.restart

    def restart_fails_to_bind(proc):  # the new process logs the bind error and exits 1
        new = original(proc)
        new.log_path.write_text("RuntimeError: could not bind 127.0.0.1:5000\n")
        exit_with(new.popen, 1)
        return new

    group.restart = restart_fails_to_bind  # type: ignore[method-assign]
    script.at(1.0, lambda: exit_with(group.get("reward").popen, 9))
    outcome = sup.run()
    assert outcome.code == 1
    assert outcome.cause == (
        "reward exited with code 1 while starting (its port 127.0.0.1:5000 could not be bound "
        f"again); restart budget (1) spent (see {tmp_path / 'reward.log'})"
    )
    assert [e["event"] for e in read_events(tmp_path) if e["service"] == "reward"] == [
        "exited",
        "restarting",
        "restart_failed",
        "gave_up",
    ]


def test_restart_that_never_turns_healthy_is_killed_and_counted(group, tmp_path):
    coordinator = child()
    group.ready = False
    sup, script = make(
        group,
        coordinator,
        tmp_path,
        restart_budget=2,
        restart_backoff_s=1.0,
        health_timeout_s=10.0,
        stop_timeout_s=BIG,
    )
    script.at(1.0, lambda: exit_with(group.get("rollout0").popen, 9))
    outcome = sup.run()
    assert outcome.cause is not None
    assert outcome.cause.startswith("rollout0 not healthy after 10s; restart budget (2) spent")
    assert group.restarts == ["rollout0", "rollout0"]
    assert group.get("rollout0").popen.returncode == -signal.SIGKILL
    events = read_events(tmp_path)
    failed = times(events, "rollout0", "restart_failed")
    spawned = times(events, "rollout0", "restarting")
    assert len(failed) == 2
    assert spawned[1] - failed[0] >= 2.0 - 1e-9  # the second restart waits the doubled backoff


def test_event_log_on_a_full_disk_logs_once_naming_the_file_and_goes_on(
    tmp_path, monkeypatch, caplog
):
    import errno
    import logging
    from pathlib import Path

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    events = EventLog(tmp_path / "supervisor.jsonl")
    monkeypatch.setattr(Path, "open", full)
    with caplog.at_level(logging.ERROR, logger="launch"):
        assert events.write("job", "failed", cause="x")["event"] == "failed"
        events.write("job", "failed", cause="y")
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 1
    assert str(tmp_path / "supervisor.jsonl") in errors[0] and "MiB free" in errors[0]
