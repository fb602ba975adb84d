"""Processes end with the launcher: liveness by pid and start time, the watchdog's steps,
and real children (direct and grandchild) ending when a stand-in launcher is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from hybridflow.deploy.lifeline import (
    PID_ENV,
    START_ENV,
    Watchdog,
    is_alive,
    launcher_env,
    process_start_ticks,
    watch_parent,
)
from tests.fault.procs import survivors, tree, wait_all_gone


def test_liveness_checks_start_time_and_zombies():
    me = os.getpid()
    start = process_start_ticks(me)
    assert start is not None and is_alive(me, start) and is_alive(me, None)
    assert not is_alive(me, start + 1)  # same pid, another process: pid reuse
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process_start_ticks(zombie.pid) is not None:  # exited, not yet reaped: a zombie
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not is_alive(zombie.pid, None)
    zombie.wait()
    assert not is_alive(zombie.pid, None)


def test_launcher_env_names_this_process():
    env = launcher_env()
    assert env[PID_ENV] == str(os.getpid())
    assert env[START_ENV] == str(process_start_ticks(os.getpid()))


def test_no_launcher_no_watchdog():
    assert watch_parent(environ={}) is None


def test_watchdog_terminates_then_hard_exits_when_the_launcher_is_gone():
    calls: list[tuple[str, object]] = []
    polls = iter([True, True, False])
    dog = Watchdog(
        123,
        456,
        terminate_self=True,
        grace_s=7.0,
        alive=lambda pid, start: next(polls),
        sleep=lambda s: calls.append(("sleep", s)),
        kill=lambda pid, sig: calls.append(("kill", (pid, sig))),
        hard_exit=lambda code: calls.append(("exit", code)),
    )
    dog.run(poll_s=1.0)
    assert calls == [
        ("sleep", 1.0),
        ("sleep", 1.0),
        ("kill", (os.getpid(), signal.SIGTERM)),
        ("sleep", 7.0),
        ("exit", 1),
    ]


def test_watchdog_leaves_the_signal_to_pdeathsig_where_armed():
    calls: list[str] = []
    dog = Watchdog(
        1,
        None,
        terminate_self=False,
        grace_s=1.0,
        alive=lambda pid, start: False,
        sleep=lambda s: calls.append("sleep"),
        kill=lambda pid, sig: calls.append("kill"),
        hard_exit=lambda code: calls.append("exit"),
    )
    dog.run(poll_s=1.0)
    assert calls == ["sleep", "exit"]


# A stand-in launcher: exports its lifeline env, starts a direct child (parent-death signal)
# and a grandchild under an intermediate process (watchdog), then waits to be killed.
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from hybridflow.deploy.lifeline import launcher_env
    env = {**os.environ, **launcher_env()}
    svc = "from hybridflow.deploy.lifeline import watch_parent; import time; " \\
        "watch_parent(poll_s=0.2, grace_s=1.0); time.sleep(600)"
    # The direct child ignores SIGTERM: only the watchdog's hard exit ends it.
    ignoring = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + svc
    subprocess.Popen([sys.executable, "-c", ignoring], env=env)
    middle = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {svc!r}]).wait()"
    subprocess.Popen([sys.executable, "-c", middle], env=env)
    print("started", flush=True)
    time.sleep(600)
    """
)


def test_children_and_grandchildren_end_when_the_launcher_is_sigkilled():
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, start_new_session=True
    )
    procs: dict = {}
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == b"started\n"
        deadline = time.monotonic() + 60
        while len(procs) < 4:  # launcher, its two children, the grandchild
            assert time.monotonic() < deadline, procs
            time.sleep(0.05)
            procs = tree(launcher.pid)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        wait_all_gone(procs, timeout_s=60)
    finally:
        for pid in survivors(procs):
            os.kill(pid, signal.SIGKILL)
