"""The ``python`` tool (``hybridflow.envs.python_tool``) through a real environment service
process, its calls run in the service's sandbox pool (``environment.sandbox``): a call's
output comes back as the observation; a call that hangs costs its own wall time and comes
back stopped, the episode going on; an escape attempt reaches nothing; the answer is run
against the task's tests; two episodes' calls run at once, one per slot."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading

import pytest

from hybridflow.data.code_task import make_code_rows
from hybridflow.envs.base import Task
from hybridflow.envs.python_tool import ENV_PATH
from hybridflow.envs.tool_calls import format_tool_call
from hybridflow.rpc.channel import wait_healthy
from hybridflow.rpc.config import ChannelConfig
from hybridflow.services.environment.client import EnvironmentServiceClient
from tests.helpers import wait_for_file

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
)
CHANNEL = ChannelConfig(timeout_s=60, retries=0, initial_backoff_s=0.05)


def call(code: str) -> str:
    return format_tool_call("python", {"code": code})


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("python-tool")
    config = tmp / "job.yaml"
    config.write_text(
        f"environment:\n  envs: [{ENV_PATH}]\n  step_timeout_s: 30\n"
        "  sandbox: {workers: 2, wall_s: 2, cpu_s: 1, memory_mb: 256}\n"
        f"coordinator:\n  multi_turn:\n    env: {ENV_PATH}\n"
    )
    port_file, log = tmp / "environment.addr", tmp / "environment.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hybridflow.main.environment", "--config", str(config),
             "--port-file", str(port_file)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for_file(port_file, proc)
        address = port_file.read_text().strip()
        wait_healthy(address, 60)
        yield EnvironmentServiceClient(address, CHANNEL)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, log.read_text()


def task() -> Task:
    row = make_code_rows(1, 0, "test")[0]
    return Task(row["prompt"], row["reward_model"]["ground_truth"], "code", row["extra_info"])


def test_a_call_runs_and_its_output_is_the_observation(service):
    service.reset("calls", ENV_PATH, task())
    result = service.step("calls", "let me check " + call("print(sum(range(10)))"))
    assert not result.done and result.reward == 0.0
    assert [(m.role, m.content.strip()) for m in result.observation] == [("tool", "45")]
    assert result.info["tool_calls"] == 1 and result.info["tool_errors"] == 0


def test_a_hung_call_costs_its_wall_time_and_the_episode_goes_on(service):
    service.reset("hangs", ENV_PATH, task())
    result = service.step("hangs", call("import time\ntime.sleep(60)"))
    (message,) = result.observation
    assert "[stopped: wall time past 2s]" in message.content and result.info["tool_errors"] == 1
    again = service.step("hangs", call("print('still here')"))
    assert again.observation[0].content.strip() == "still here"


def test_an_escape_attempt_reaches_nothing(service):
    service.reset("escape", ENV_PATH, task())
    probe = (
        "import os, socket\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(os.environ.get('HYBRIDFLOW_TOKEN'), os.path.exists('/root'))\n"
        "try:\n    socket.create_connection(('127.0.0.1', 22), 1)\nexcept OSError as e:\n"
        "    print('no network', e.errno)\n"
    )
    (message,) = service.step("escape", call(probe)).observation
    lines = message.content.strip().splitlines()
    assert lines[0] == "['1']" and lines[1] == "None False" and lines[2].startswith("no network")


def test_the_answer_is_run_against_the_tasks_tests(service):
    right = make_code_rows(1, 0, "test")[0]["extra_info"]["solution"]
    service.reset("right", ENV_PATH, task())
    done = service.step("right", f"<answer>{right}</answer>")
    assert done.done and done.reward == 1.0 and done.info["outcome"] == "passed"
    service.reset("wrong", ENV_PATH, task())
    done = service.step("wrong", "def f(x) return x")
    assert done.done and done.reward == 0.0 and done.info["outcome"] == "syntax_error"


def test_two_episodes_calls_run_at_once(service):
    """Each call waits (inside its sandbox) ~1.5 s; two at once on two slots both finish
    within the 2 s wall time, which one after the other on one slot would not... so the
    result says so by content, not by a clock: each call reports it was not stopped."""
    for name in ("a", "b"):
        service.reset(name, ENV_PATH, task())
    out: dict[str, str] = {}

    def step(name: str) -> None:
        result = service.step(name, call("import time\ntime.sleep(1.5)\nprint('done')"))
        out[name] = result.observation[0].content.strip()

    threads = [threading.Thread(target=step, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out == {"a": "done", "b": "done"}
