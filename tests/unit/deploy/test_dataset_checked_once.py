"""Under deploy/launch.sh the dataset is validated once and loaded once: the launcher's
preflight validates it and hands its stamp to the coordinator, whose own preflight then
leaves the dataset out; a file changed in between, other inputs of the check, or no launcher
at all, and the coordinator validates it itself (``hybridflow/deploy/dataset_stamp.py``)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hybridflow.deploy import dataset_stamp
from hybridflow.deploy.launch import main
from hybridflow.deploy.preflight import coordinator_problems, dataset_problems
from hybridflow.job_config import load_job_config
from hybridflow.main import coordinator_run as run

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = str(REPO / "deploy" / "configs" / "quickstart.yaml")
GOOD = {"prompt": "1+1=", "data_source": "arith", "reward_model": {"ground_truth": "2"}}
ADDRESSES = [
    "coordinator.rollout_addresses=[127.0.0.1:5001]",
    "coordinator.reward_address=127.0.0.1:5002",
    "coordinator.learner_address=127.0.0.1:5003",
]


@pytest.fixture(autouse=True)
def keep_process_state(monkeypatch):  # type: ignore[no-untyped-def]
    """The launcher sets the umask, SIGINT / SIGTERM handlers and the startup log; the test
    process gets its own back."""
    old_umask = os.umask(0o022)
    os.umask(old_umask)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setenv("HYBRIDFLOW_STARTUP_LOG", "")
    monkeypatch.setenv("HYBRIDFLOW_TOKEN", "test")
    monkeypatch.delenv(dataset_stamp.ENV, raising=False)
    yield
    os.umask(old_umask)
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@pytest.fixture
def reads(monkeypatch):  # type: ignore[no-untyped-def]
    """Each pass over a dataset file, by kind: ``validate`` (preflight's row check) and
    ``load`` (the coordinator's tokenising read). The quickstart's held-out set (a builtin,
    generated, no file) is left out."""
    from hybridflow.data import datasets

    passes: dict[str, list[str]] = {"validate": [], "load": []}
    check, read = datasets.check_prompt_rows, datasets.read_prompt_dataset

    def counted_check(spec: str, *args: Any, **kw: Any) -> list[str]:
        if not spec.startswith("builtin:"):
            passes["validate"].append(spec)
        return check(spec, *args, **kw)

    def counted_read(spec: str, *args: Any, **kw: Any) -> Any:
        if not spec.startswith("builtin:"):
            passes["load"].append(spec)
        return read(spec, *args, **kw)

    monkeypatch.setattr(datasets, "check_prompt_rows", counted_check)
    monkeypatch.setattr(datasets, "read_prompt_dataset", counted_read)
    return passes


class _EndedCoordinator:
    """Stands in for the coordinator's process: records its command and environment."""

    started: list[_EndedCoordinator] = []

    def __init__(self, cmd: list[str], stdin: Any = None, env: Any = None, **_: Any) -> None:
        self.cmd, self.env, self.returncode = cmd, dict(env), 0
        _EndedCoordinator.started.append(self)

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


class _Services:
    """Stands in for ServiceGroup: starts nothing; the start then fails, so ``main`` ends
    right after it started the coordinator."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.processes: list[Any] = []
        self.kill_now = False

    def start(self) -> None:
        pass

    def wait_ready(self, timeout_s: float, watch: Any) -> dict[str, str]:
        raise RuntimeError("reward exited with code 1 before serving (test)")

    def stop(self) -> None:
        pass


def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: Path) -> _EndedCoordinator:
    """deploy/launch.sh's ``main`` up to its start of the coordinator: the command and
    environment it gave it."""
    monkeypatch.setattr("hybridflow.deploy.launcher.ServiceGroup", _Services)
    fake = SimpleNamespace(
        Popen=_EndedCoordinator, PIPE=subprocess.PIPE, TimeoutExpired=subprocess.TimeoutExpired
    )
    monkeypatch.setattr("hybridflow.deploy.launch.subprocess", fake)
    _EndedCoordinator.started = []
    args = ["--config", QUICKSTART, "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--set", f"coordinator.data={data}"]) == 1  # the faked failed start
    (coordinator,) = _EndedCoordinator.started
    return coordinator


def prepare_coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: _EndedCoordinator
) -> Any:
    """The coordinator's preparation (config, preflight, tokenizer, dataset, addresses) as
    the launcher started it: its command line and environment, the addresses on stdin."""
    cmd = started.cmd
    config = cmd[cmd.index("--config") + 1]
    overrides = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]
    if dataset_stamp.ENV in started.env:
        monkeypatch.setenv(dataset_stamp.ENV, started.env[dataset_stamp.ENV])
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(ADDRESSES) + "\n"))
    prepared = run._prepare(config, overrides, str(tmp_path / "coordinator"), True)
    if prepared.run_lock is not None:
        prepared.run_lock.release()
    return prepared


def write_rows(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_under_the_launcher_the_dataset_is_validated_once_and_loaded_once(
    tmp_path, monkeypatch, reads
):
    data = write_rows(tmp_path / "prompts.jsonl", [GOOD, GOOD])
    started = launch(tmp_path, monkeypatch, data)
    assert reads == {"validate": [str(data)], "load": []}  # the launcher's preflight
    assert dataset_stamp.ENV in started.env

    prepared = prepare_coordinator(tmp_path, monkeypatch, started)

    assert reads == {"validate": [str(data)], "load": [str(data)]}
    assert len(prepared.dataset.records) == 2
    assert prepared.job.coordinator.reward_address == "127.0.0.1:5002"  # addresses applied


@pytest.mark.parametrize("change", ["bad row appended", "replaced, same bytes", "touched"])
def test_a_dataset_changed_after_the_launchers_preflight_is_validated_again(
    tmp_path, monkeypatch, reads, capsys, change
):
    data = write_rows(tmp_path / "prompts.jsonl", [GOOD, GOOD])
    started = launch(tmp_path, monkeypatch, data)
    if change == "bad row appended":
        with data.open("a") as f:
            f.write('{"prompt": "2+2=", "data_source": "arith"}\n')
    elif change == "replaced, same bytes":
        copy = write_rows(tmp_path / "copy.jsonl", [GOOD, GOOD])
        stat = data.stat()
        os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the inode differs
        copy.replace(data)
    else:
        stat = data.stat()
        os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))

    if change == "bad row appended":
        with pytest.raises(run._Exit) as refused:
            prepare_coordinator(tmp_path, monkeypatch, started)
        assert refused.value.code == 2
        assert "ground_truth" in capsys.readouterr().err  # found by the coordinator's check
        assert reads == {"validate": [str(data)] * 2, "load": []}
    else:
        prepare_coordinator(tmp_path, monkeypatch, started)
        assert reads == {"validate": [str(data)] * 2, "load": [str(data)]}


def test_a_coordinator_started_without_the_launcher_validates_the_dataset(tmp_path, reads):
    data = write_rows(tmp_path / "prompts.jsonl", [GOOD])
    prepared = run._prepare(
        QUICKSTART, [f"coordinator.data={data}", *ADDRESSES], str(tmp_path / "run"), False
    )
    if prepared.run_lock is not None:
        prepared.run_lock.release()
    assert reads == {"validate": [str(data)], "load": [str(data)]}


def test_the_stamp_holds_only_for_the_same_inputs_of_the_check(tmp_path, reads):
    data = write_rows(tmp_path / "prompts.jsonl", [GOOD])
    job = load_job_config(QUICKSTART, [f"coordinator.data={data}"])
    assert dataset_problems(job) == []
    env = dataset_stamp.checked_env(job)
    assert coordinator_problems(job, env) == [] and len(reads["validate"]) == 1
    other = load_job_config(QUICKSTART, [f"coordinator.data={data}", "reward.format_score=0.5"])
    assert coordinator_problems(other, env) == [] and len(reads["validate"]) == 2
    assert coordinator_problems(job, {dataset_stamp.ENV: "not json"}) == []
    assert len(reads["validate"]) == 3


def test_a_dataset_with_problems_gets_no_stamp(tmp_path):
    data = write_rows(tmp_path / "prompts.jsonl", [{"prompt": "1+1=", "data_source": "arith"}])
    job = load_job_config(QUICKSTART, [f"coordinator.data={data}"])
    assert dataset_problems(job)
    assert dataset_stamp.checked_env(job) == {}
