"""The bubblewrap sandbox (``hybridflow/sandbox/``) holds: each escape a policy's program
might try ends with the program stopped (or harmless), a named outcome, nothing of the host
reached and nothing left running. Real bwrap, real programs (the system's python3)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from hybridflow.sandbox import SandboxLimits, SandboxUnavailable
from hybridflow.sandbox.bubblewrap import BubblewrapSandbox

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
)
LIMITS = SandboxLimits(wall_s=3, cpu_s=1, memory_bytes=256 * 1024 * 1024, processes=32)
MARK = "hybridflow-sandbox-escape-test"


@pytest.fixture(scope="module")
def sandbox() -> BubblewrapSandbox:
    return BubblewrapSandbox()


def run(sandbox: BubblewrapSandbox, code: str, limits: SandboxLimits = LIMITS):
    return sandbox.run(["python3", "-I", "p.py", MARK], {"p.py": code}, limits)


def left_running() -> list[str]:
    """Processes still running a test program (their command line holds MARK)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if MARK in line and "ps -eo" not in line]


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    assert left_running() == []


def test_a_plain_program_runs_and_its_output_comes_back(sandbox):
    result = sandbox.run(["python3", "-I", "p.py"], {"p.py": "print(sum(range(10)))"}, LIMITS)
    assert (result.outcome, result.exit_code, result.stdout) == ("ok", 0, b"45\n")


def test_a_loopback_port_of_our_own_services_cannot_be_reached(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        code = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), 1); print('REACHED')\n"
            "except OSError as e:\n    print('refused', e.errno)"
        )
        result = run(sandbox, code)
    finally:
        server.close()
    assert result.outcome == "ok" and b"REACHED" not in result.stdout
    assert result.stdout.startswith(b"refused")


def test_the_run_directory_token_home_and_environment_are_not_visible(
    sandbox, tmp_path, monkeypatch
):
    token = tmp_path / "token"
    token.write_text("s3cret")
    monkeypatch.setenv("HYBRIDFLOW_TOKEN", "s3cret")
    code = (
        "import os, json\n"
        f"print(json.dumps([os.path.exists({str(token)!r}), os.path.exists({os.getcwd()!r}),\n"
        "  os.path.exists('/root'), os.path.exists('/etc/passwd'), dict(os.environ)]))"
    )
    result = run(sandbox, code)
    assert result.outcome == "ok"
    assert b"s3cret" not in result.stdout
    assert result.stdout.startswith(b"[false, false, false, false, {")


def test_other_processes_are_not_in_its_proc(sandbox):
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    result = run(sandbox, code)
    assert result.outcome == "ok"
    pids = eval(result.stdout)  # noqa: S307 (our own program's list of ints)
    assert len(pids) <= 3 and str(os.getpid()).encode() not in result.stdout


def test_writing_outside_the_scratch_directory_fails(sandbox):
    code = (
        "import os\nfor p in ('/usr/x', '/bin/x', '/x'):\n"
        "    try:\n        open(p, 'w'); print('WROTE', p)\n"
        "    except OSError as e:\n        print('no', e.errno)\n"
        "open('ok.txt', 'w').write('fine'); print(open('ok.txt').read())"
    )
    result = run(sandbox, code)
    assert result.outcome == "ok" and b"WROTE" not in result.stdout
    assert result.stdout.endswith(b"fine\n")


def test_a_fork_bomb_is_capped_and_stopped_at_its_wall_time(sandbox):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run(sandbox, code, SandboxLimits(wall_s=2, cpu_s=1, processes=16))
    assert result.outcome in ("timeout", "cpu"), result


def test_processes_are_capped_at_the_limit_also_for_a_root_caller(sandbox):
    code = (
        "import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n"
        "        os._exit(0)\n    n += 1\nprint(n)"
    )
    result = run(sandbox, code, SandboxLimits(wall_s=10, processes=16))
    assert result.outcome == "ok"
    assert 0 < int(result.stdout) < 16  # root is exempt from RLIMIT_NPROC: bwrap runs as 65534


def test_a_memory_bomb_stops_at_the_memory_limit(sandbox):
    result = run(sandbox, "x = bytearray(2 * 1024 ** 3)")
    assert result.outcome == "memory" and "memory past" in result.reason


def test_an_infinite_loop_stops_at_the_cpu_limit(sandbox):
    # wall time far above the CPU limit: on a busy machine a CPU second takes longer
    result = run(sandbox, "while True:\n    pass", SandboxLimits(wall_s=60, cpu_s=1))
    assert result.outcome == "cpu" and "CPU time past 1s" in result.reason


def test_a_sleeper_stops_at_the_wall_time(sandbox):
    result = run(sandbox, "import time\ntime.sleep(60)")
    assert result.outcome == "timeout" and "wall time past 3s" in result.reason


def test_an_output_flood_is_cut_at_the_limit(sandbox):
    limits = SandboxLimits(wall_s=5, output_bytes=4096)
    result = run(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", limits)
    assert result.outcome == "output" and len(result.stdout) == 4096


def test_signalling_its_parent_reaches_only_the_sandbox(sandbox):
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)"
    result = run(sandbox, code)
    assert result.outcome in ("ok", "exit")  # this process is alive: the test goes on


def test_a_process_left_behind_dies_with_the_sandbox(sandbox):
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\n"
        "print('parent done')"
    )
    result = run(sandbox, code)
    assert result.outcome == "ok"  # the autouse check: nothing holding MARK is left


def test_a_missing_bwrap_is_refused_not_run_unsandboxed():
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        BubblewrapSandbox("no-such-bwrap")


def test_a_file_name_leaving_the_scratch_is_refused(sandbox):
    with pytest.raises(ValueError, match="inside the scratch"):
        sandbox.run(["python3", "p.py"], {"../p.py": "print(1)"}, LIMITS)
