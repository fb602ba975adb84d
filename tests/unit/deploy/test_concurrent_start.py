"""The launcher waits for every service at once: real child processes (one serves gRPC
health, one dies, one never serves), the first to fail named whatever its place in line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.deploy.launcher import ServiceGroup, ServiceProcess
from hybridflow.job_config import JobConfig

# serve: a real gRPC server with health, its address in the port file; die: exits 3 at once;
# silent: never writes its port file. Each waits on stdin otherwise (ended by group.stop()).
CHILD = """
import sys
mode, port_file = sys.argv[1], sys.argv[2]
if mode == "die":
    print("boom: no model here", flush=True)
    sys.exit(3)
if mode == "serve":
    from hybridflow.rpc.config import ServerConfig
    from hybridflow.rpc.server import start_server, write_port_file
    running = start_server(ServerConfig(), lambda server: None, [])
    write_port_file(port_file, running.address)
sys.stdin.read()
"""


def _child(group: ServiceGroup, tmp_path: Path, name: str, mode: str) -> ServiceProcess:
    port_file, log_path = tmp_path / f"{name}.addr", tmp_path / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDFLOW_TOKEN"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    with log_path.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, str(port_file)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    proc = ServiceProcess(name, popen, port_file, log_path)
    group.processes.append(proc)
    return proc


@pytest.fixture
def group(tmp_path):  # type: ignore[no-untyped-def]
    with ServiceGroup(JobConfig(), None, [], tmp_path) as services:
        yield services  # exit stops every child


def test_all_services_become_ready_together(group, tmp_path):
    procs = [_child(group, tmp_path, n, "serve") for n in ("reward", "learner", "rollout0")]
    addresses = group.wait_ready(120.0)
    assert set(addresses) == {"reward", "learner", "rollout0"}
    for proc in procs:
        assert addresses[proc.name] == proc.port_file.read_text().strip()
        assert addresses[proc.name].startswith("127.0.0.1:")


def test_a_service_that_dies_is_named_while_an_earlier_one_still_starts(group, tmp_path):
    _child(group, tmp_path, "learner", "silent")  # first in line, never serves
    _child(group, tmp_path, "reward", "die")
    with pytest.raises(RuntimeError, match=r"reward exited with code 3 before serving") as info:
        group.wait_ready(600.0)  # far off: the waiting ends at the death, not the deadline
    assert "boom: no model here" in str(info.value)  # the tail of its log


def test_a_service_that_misses_its_deadline_is_named(group, tmp_path):
    _child(group, tmp_path, "rollout0", "silent")
    with pytest.raises(TimeoutError, match=r"rollout0 not serving after 1s"):
        group.wait_ready(1.0)


def test_the_coordinator_exiting_ends_the_wait(group, tmp_path):
    _child(group, tmp_path, "learner", "silent")
    coordinator = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    coordinator.wait()
    with pytest.raises(RuntimeError, match=r"coordinator exited with code 2 before the services"):
        group.wait_ready(600.0, watch=[("coordinator", coordinator)])
