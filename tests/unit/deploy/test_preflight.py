"""Preflight (finding 9): bad config and data are refused before any service starts, every
problem one line naming the key, file or row, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from hybridflow.deploy.preflight import dataset_problems, problems
from hybridflow.job_config import load_job_config

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "deploy" / "configs" / "quickstart.yaml"


def write_rows(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def row(prompt: str = "1+1=", truth: str | None = "2", source: str = "arith") -> dict:
    out: dict = {"prompt": prompt, "data_source": source}
    if truth is not None:
        out["reward_model"] = {"ground_truth": truth}
    return out


def data_problems(path: Path, *extra: str) -> list[str]:
    return problems(QUICKSTART, [f"coordinator.data={path}", *extra])


def test_quickstart_config_passes():
    assert problems(QUICKSTART) == []


def test_every_config_problem_is_one_line_naming_its_key():
    found = problems(
        QUICKSTART,
        [
            "rollout.num_threads=-3",
            "deploy.health_timeout_s=-5",
            "reward.server.max_workers=0",
            "learner.server.max_workers=0",
            "coordinator.num_steps=0",
        ],
    )
    assert found == [
        "config error: rollout.num_threads: must be >= 1, got -3",
        "config error: reward.server.max_workers: must be in [1, 1024], got 0",
        "config error: learner.server.max_workers: must be in [1, 1024], got 0",
        "config error: coordinator.num_steps: must be >= 1, got 0",
        "config error: deploy.health_timeout_s: must be > 0, got -5.0",
    ]


def test_unknown_key_and_missing_file_are_config_errors(tmp_path):
    assert problems(QUICKSTART, ["rollout.nmu_threads=2"])[0].startswith(
        "config error: unknown key 'rollout.nmu_threads'"
    )
    assert problems(tmp_path / "nope.yaml") == [
        f"config error: config file not found: {tmp_path / 'nope.yaml'}"
    ]


def test_a_fixed_port_in_use_is_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        found = problems(QUICKSTART, [f"learner.server.port={port}"])
    assert len(found) == 1
    assert found[0].startswith(
        f"config error: learner.server.port: cannot listen on 127.0.0.1:{port}"
    )


def test_a_free_fixed_port_passes_and_shared_ports_are_refused():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # (the port was free a moment ago; another process could take it, hence only == [] once)
    shared = problems(QUICKSTART, [f"reward.server.port={port}", f"learner.server.port={port}"])
    assert any("learner.server.port" in p and "also reward.server.port" in p for p in shared)
    replicas = problems(QUICKSTART, [f"rollout.server.port={port}", "rollout.replicas=2"])
    assert replicas == [
        f"config error: rollout.server.port: fixed port {port} with rollout.replicas=2 "
        "(replicas cannot share a port; use 0)"
    ]


def test_model_must_be_a_known_builtin_or_a_checkpoint_dir(tmp_path):
    assert problems(QUICKSTART, ["model=builtin:huge"]) == [
        "config error: model: unknown builtin model 'huge'; known: "
        "['qwen2.5-0.5b-shape', 'tiny', 'tiny-code', 'tiny-qwen3', 'tiny-random', 'tiny-tools']"
    ]
    assert problems(QUICKSTART, ["model=builtin:qwen2.5-0.5b-shape"]) == []
    assert "is not a directory" in problems(QUICKSTART, [f"model={tmp_path / 'x'}"])[0]
    assert "has no config.json" in problems(QUICKSTART, [f"model={tmp_path}"])[0]
    (tmp_path / "config.json").write_text("{}")
    assert problems(QUICKSTART, [f"model={tmp_path}"]) == []


def test_reward_model_components_need_a_known_builtin_or_a_checkpoint_dir(tmp_path):
    rule = ["reward.components=[{name: rule}, {name: rm, kind: model, model: builtin:tiny-rm}]"]
    assert problems(QUICKSTART, rule) == []
    missing = tmp_path / "no-such-rm"
    found = problems(
        QUICKSTART,
        [f"reward.components=[{{name: rule}}, {{name: rm, kind: model, model: '{missing}'}}]"],
    )
    assert found == [
        f"config error: reward.components[1].model: '{missing}' is not a directory "
        "(nor builtin:tiny-rm, nor a hub id org/name)"
    ]
    unknown = ["reward.components=[{name: rm, kind: model, model: 'builtin:tiny'}]"]
    assert problems(QUICKSTART, unknown) == [
        "config error: reward.components[0].model: unknown builtin reward model 'tiny'; "
        "known: ['tiny-rm']"
    ]
    assert problems(QUICKSTART, ["model=builtin:tiny-rm"]) == [
        "config error: model: unknown builtin model 'tiny-rm'; known: "
        "['qwen2.5-0.5b-shape', 'tiny', 'tiny-code', 'tiny-qwen3', 'tiny-random', 'tiny-tools']"
    ]


def test_tls_files_must_exist(tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    found = problems(
        QUICKSTART,
        [
            f"reward.server.tls_cert={cert}",
            f"reward.server.tls_key={tmp_path / 'key.pem'}",
            f"coordinator.channel.tls_ca={tmp_path / 'ca.pem'}",
        ],
    )
    assert found == [
        f"config error: reward.server.tls_key: no such file '{tmp_path / 'key.pem'}'",
        f"config error: coordinator.channel.tls_ca: no such file '{tmp_path / 'ca.pem'}'",
    ]


def test_good_dataset_file_passes(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [row(), row("2+2=", "4")])
    assert data_problems(path) == []


def test_missing_empty_and_unknown_datasets(tmp_path):
    assert data_problems(tmp_path / "none.jsonl") == [
        f"data error: dataset '{tmp_path / 'none.jsonl'}': no such file "
        "(expected builtin:arith, builtin:arith:train, builtin:arith:test, builtin:code, "
        "builtin:code:train, builtin:code:test, builtin:calc, builtin:guess, .jsonl, .parquet "
        "or sharegpt:PATH)"
    ]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert data_problems(empty) == [f"data error: {empty}: the dataset has no rows"]
    assert problems(QUICKSTART, ["coordinator.data=builtin:nope"]) == [
        "config error: coordinator.data: unknown builtin dataset 'builtin:nope'; "
        "known: ['builtin:arith', 'builtin:arith:train', 'builtin:arith:test', 'builtin:code', "
        "'builtin:code:train', 'builtin:code:test', 'builtin:calc', 'builtin:guess']"
    ]


def as_nobody(check: Callable[[], list[str]]) -> list[str]:
    """``check()`` run in a forked child whose effective user is nobody (root reads any
    file, so a root test run checks an unreadable file as another user would meet it). What
    ``check`` imports must be imported already: nobody may not read the interpreter's own
    library (here it lies under /root)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setegid(65534)
            os.seteuid(65534)
            os.write(write, json.dumps(check()).encode())
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found = pipe.read()
    os.waitpid(child, 0)
    assert found, "the child as nobody reported nothing"
    return list(json.loads(found))


def test_unreadable_dataset(tmp_path):
    directory = tmp_path / "shared"
    directory.mkdir()
    for d in (directory, *directory.parents):  # nobody must reach the file to be refused it
        if d.stat().st_uid == os.geteuid() and d != Path("/"):
            d.chmod(d.stat().st_mode | 0o711)
    path = write_rows(directory / "d.jsonl", [row()])
    assert data_problems(path) == []  # readable, and the modules the check needs imported
    path.chmod(0)
    # The job is loaded here: nobody may not read the checkout or HYBRIDFLOW_HOME (CI's are
    # private temp dirs); the child checks only the dataset.
    job = load_job_config(QUICKSTART, [f"coordinator.data={path}"])
    try:
        found = (
            as_nobody(lambda: dataset_problems(job)) if os.geteuid() == 0 else data_problems(path)
        )
    finally:
        path.chmod(0o600)
    assert found == [f"data error: dataset '{path}': cannot read: Permission denied"]


def test_every_bad_row_is_one_line_naming_file_and_line(tmp_path):
    path = write_rows(
        tmp_path / "d.jsonl",
        [
            row(),
            "{not json",
            {"data_source": "arith"},
            row(truth=None),
            row(source="nobody_scores_this"),
            row(prompt=""),
        ],
    )
    assert data_problems(path) == [
        f"data error: {path}:2: invalid JSON: Expecting property name enclosed in double "
        "quotes (column 2)",
        f"data error: {path}:3: missing field 'prompt'",
        f"data error: {path}:4: missing field \"reward_model.ground_truth\" (the 'arith' "
        "scorer needs one)",
        f"data error: {path}:5: no reward scorer for data_source 'nobody_scores_this'",
        f"data error: {path}:6: field 'prompt' is an empty string",
    ]


def test_rows_without_ground_truth_pass_when_their_scorer_takes_none(tmp_path):
    scorer = tmp_path / "score.py"
    scorer.write_text("def score(response, ground_truth, extra_info):\n    return 0.0\n")
    path = write_rows(tmp_path / "d.jsonl", [row(truth=None, source="mine")])
    assert data_problems(path, f"reward.scorers={{mine: '{scorer}:score'}}") == []


def test_listing_stops_after_twenty_bad_rows(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [row(truth=None)] * 25)
    found = data_problems(path)
    assert len(found) == 21 and found[-1] == f"data error: {path}: 5 more bad rows not listed"


def test_oversized_prompts_are_named_without_reading_the_line(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [row(), row("x" * 2000), row("y" * 100_000), row()])
    found = data_problems(path, "coordinator.max_prompt_bytes=1000")
    limit = 8 * 1000 + 1024 * 1024
    assert found == [
        f"data error: {path}:2: prompt is 2000 bytes, over coordinator.max_prompt_bytes=1000",
        f"data error: {path}:3: prompt is 100000 bytes, over coordinator.max_prompt_bytes=1000",
    ]
    huge = write_rows(tmp_path / "huge.jsonl", [row("z" * (limit + 10)), row()])
    assert data_problems(huge, "coordinator.max_prompt_bytes=1000") == [
        f"data error: {huge}:1: line longer than {limit} bytes (prompt limit "
        "coordinator.max_prompt_bytes=1000)"
    ]


def test_preflight_cli_prints_ok_or_problems():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "hybridflow.deploy.preflight", "--config", str(QUICKSTART)]
    ok = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert (ok.returncode, ok.stdout) == (0, "ok\n")
    bad = subprocess.run(
        [*cmd, "--set", "rollout.num_threads=-3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr == "config error: rollout.num_threads: must be >= 1, got -3\n"


def test_launch_refuses_a_bad_job_before_starting_anything(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", [row(), row(truth=None)])
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.deploy.launch",
            "--config",
            str(QUICKSTART),
            "--run-dir",
            str(run_dir),
            "--set",
            f"coordinator.data={data}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f'data error: {data}:2: missing field "reward_model.ground_truth" '
        "(the 'arith' scorer needs one)"
    ]
    assert not run_dir.exists()  # no logs/, no port files: nothing was started


def test_preflight_imports_no_torch_transformers_or_grpc():
    code = (
        "import sys; from hybridflow.deploy.preflight import problems; "
        f"assert problems({str(QUICKSTART)!r}) == []; "
        "print(sorted(m for m in ('torch', 'transformers', 'grpc') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert (out.returncode, out.stdout) == (0, "[]\n"), out.stderr


def test_a_code_job_needs_its_sandbox_here(monkeypatch):
    code_job = str(REPO / "deploy" / "configs" / "code.yaml")
    assert problems(code_job) == []  # bubblewrap is installed here (CI installs it)
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)  # as on a bare machine
    found = problems(code_job)
    assert len(found) == 1 and "reward.sandbox" in found[0] and "bubblewrap" in found[0]
    python_tool = "hybridflow.envs.python_tool:PythonToolEnv"
    tool = [f"environment.envs=[{python_tool}]", f"coordinator.multi_turn.env={python_tool}"]
    found = problems(QUICKSTART, [*tool, "coordinator.data=builtin:code"])
    assert len(found) == 1 and "environment.sandbox" in found[0]
    assert problems(QUICKSTART) == []  # a job without code never asks


def test_a_tinker_job_is_refused_off_loopback_without_tls_or_on_a_busy_port(tmp_path):
    tinker = REPO / "deploy" / "configs" / "tinker.yaml"
    assert problems(tinker, ["tinker.port=0"]) == []
    off = problems(tinker, ["tinker.port=0", "tinker.host=0.0.0.0"])
    assert off == [
        "config error: tinker.host 0.0.0.0 is off loopback: set tinker.tls_cert and tinker.tls_key"
    ]
    missing = problems(tinker, ["tinker.port=0", f"tinker.keys_file={tmp_path / 'nope'}"])
    assert missing == [f"config error: tinker.keys_file: no such file '{tmp_path / 'nope'}'"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        found = problems(tinker, [f"tinker.port={port}"])
    assert len(found) == 1 and found[0].startswith("config error: tinker.port: cannot listen")
