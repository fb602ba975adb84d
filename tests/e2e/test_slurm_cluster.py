"""deploy/slurm/hybridflow.sbatch on a real Slurm cluster (tests/slurm_cluster.py: three
slurmds, each in its own network namespace): the quickstart across three nodes with TLS and
the token on, learning (>= 0.9); the plan the real run executes is the one the dry run
prints; scancel and requeue stop with a checkpoint and the requeued job resumes to the end
with every prompt trained exactly once.

Needs root, ``ip netns`` and the Slurm packages; skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow.coordinator.metrics import read_step_lines
from tests.fault.harness import audit
from tests.slurm_cluster import NODE_INTERFACE, SlurmCluster

REPO = Path(__file__).resolve().parents[2]
CONFIG = "deploy/configs/quickstart.yaml"
SBATCH = "deploy/slurm/hybridflow.sbatch"
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _certificate(tmp: Path, addresses: list[str]) -> tuple[Path, Path]:
    """One self-signed certificate naming every node's address (the CA clients trust)."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    sans = ",".join(f"IP:{a}" for a in addresses)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=hybridflow-test", "-addext", f"subjectAltName={sans}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def _job_args(
    cluster: SlurmCluster, tmp: Path, run_dir: Path | None, extra: list[str], config: str = CONFIG
) -> list[str]:
    """The sbatch script's arguments: the job (the quickstart unless ``config``), TLS on every
    service, the run dir (None: the job's own under deploy.run_root)."""
    cert, key = _certificate(tmp, list(cluster.nodes.values()))
    overrides = [
        "coordinator.progress=false",
        f"coordinator.channel.tls_ca={cert}",
        *(f"{svc}.server.{k}={v}" for svc in ("rollout", "reward", "learner", "environment")
          for k, v in (("tls_cert", cert), ("tls_key", key))),
        *extra,
    ]  # fmt: skip
    args = ["--config", config, *(["--run-dir", str(run_dir)] if run_dir else [])]
    for override in overrides:
        args += ["--set", override]
    return args


def _job_env(cluster: SlurmCluster) -> dict[str, str]:
    """What sbatch passes on to every step: the cluster's client settings, this python."""
    env = {**cluster.env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env["GLOO_SOCKET_IFNAME"] = NODE_INTERFACE  # what a multi-node learner's ranks bind
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("HYBRIDFLOW_TOKEN", None)  # the run dir's token file: shared by every step
    return env


def _submit(cluster: SlurmCluster, tmp: Path, args: list[str], options: tuple = ()) -> str:
    """sbatch on three nodes (``options``: more of sbatch's own); the job id."""
    out = subprocess.run(
        ["sbatch", "--parsable", "--nodes=3", f"--output={tmp}/job-%j.out", *options, SBATCH,
         *args],
        cwd=REPO, env=_job_env(cluster), capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def _dry_run(cluster: SlurmCluster, args: list[str]) -> list[str]:
    """The plan the sbatch script prints for this allocation (all three nodes), run here."""
    env = {**_job_env(cluster), "HYBRIDFLOW_DRY_RUN": "1"}
    env["SLURM_JOB_NODELIST"] = ",".join(cluster.names)
    out = subprocess.run(
        ["/bin/bash", SBATCH, *args], cwd=REPO, env=env, capture_output=True, text=True,
        check=True, timeout=120,
    )  # fmt: skip
    return out.stdout.splitlines()


def _diagnostics(tmp: Path, run_dir: Path) -> str:
    files = [*sorted(tmp.glob("job-*.out")), *sorted((run_dir / "logs").glob("*.log"))]
    return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in files)


def _wait_for_file(path: Path, timeout_s: float, why: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path} ({why})")
        time.sleep(0.5)


@pytest.mark.slow
def test_a_learner_on_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path):
    """--learner-nodes 2: torchrun's rendezvous on node1, one rank on each of node1 and
    node2, the replica and the reward service sharing node3; it trains and stops cleanly."""
    cluster = slurm_cluster
    run_dir = tmp_path / "run"
    args = _job_args(cluster, tmp_path, run_dir, ["coordinator.num_steps=30"])
    job = _submit(cluster, tmp_path, [*args, "--learner-nodes", "2"])
    state = cluster.wait_job(job, DONE, 600)
    assert state == "COMPLETED", f"job {job} {state}" + _diagnostics(tmp_path, run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["num_steps"] == 30
    plan = (run_dir / "slurm" / "plan.txt").read_text().splitlines()
    assert [line.split(" on ")[1].split()[0].rstrip(":") for line in plan] == [
        "node1", "node2", "node3", "node3", "node1",
    ]  # fmt: skip
    for step in ("learner0", "learner1", "rollout0", "reward"):
        assert "Traceback" not in (run_dir / "logs" / f"{step}.log").read_text(), step


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "dist"])
def test_quickstart_learns_on_three_slurm_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path, transport: str
):
    """The sbatch script's gRPC weight sync, and torch.distributed's (gloo here, NCCL on
    GPUs) across the nodes, its store on the first node."""
    cluster = slurm_cluster
    run_dir = tmp_path / "run"
    extra = ["coordinator.num_steps=150", f"weight_sync.transport={transport}"]
    # One machine shares /dev/shm: off, the weights take the socket path a real node's would.
    extra += ["weight_sync.shared_memory=off"] if transport == "dist" else []
    args = _job_args(cluster, tmp_path, run_dir, extra)
    plan = _dry_run(cluster, args)
    started = time.monotonic()
    job = _submit(cluster, tmp_path, args)
    state = cluster.wait_job(job, DONE, 900)
    wall_s = time.monotonic() - started
    assert state == "COMPLETED", f"job {job} {state}" + _diagnostics(tmp_path, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        f"\n3-node Slurm quickstart ({transport}): {wall_s:.0f}s sbatch to COMPLETED, reward "
        f"{summary['reward_start']:.3f} -> {summary['reward_end']:.3f}"
    )
    assert summary["num_steps"] == 150
    assert summary["reward_end"] >= 0.9, summary
    # The real run executed the plan the dry run printed, placed as asked.
    assert (run_dir / "slurm" / "plan.txt").read_text().splitlines() == plan
    where = {line.split(" on ")[0]: line.split(" on ")[1].split()[0].rstrip(":") for line in plan}
    assert where == {
        "learner0": "node1", "rollout0": "node2", "reward": "node3", "coordinator": "node1",
    }  # fmt: skip
    assert (run_dir / "token").stat().st_mode & 0o077 == 0
    for step in ("learner0", "rollout0", "reward"):
        assert "Traceback" not in (run_dir / "logs" / f"{step}.log").read_text()


@pytest.mark.slow
def test_a_multi_turn_job_runs_its_environment_service_as_its_own_step(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    """guess-number (environment.envs lists its class): the plan starts the environment
    service on the third node beside the reward, the coordinator's episodes step there (not
    in its own process), and the job completes."""
    cluster = slurm_cluster
    run_dir = tmp_path / "run"
    config = "deploy/configs/guess-number.yaml"
    args = _job_args(cluster, tmp_path, run_dir, ["coordinator.num_steps=6"], config)
    job = _submit(cluster, tmp_path, args)
    state = cluster.wait_job(job, DONE, 900)
    assert state == "COMPLETED", f"job {job} {state}" + _diagnostics(tmp_path, run_dir)
    plan = (run_dir / "slurm" / "plan.txt").read_text().splitlines()
    where = {line.split(" on ")[0]: line.split(" on ")[1].split()[0].rstrip(":") for line in plan}
    assert where == {
        "learner0": "node1", "rollout0": "node2", "reward": "node3", "environment": "node3",
        "coordinator": "node1",
    }  # fmt: skip
    assert json.loads((run_dir / "summary.json").read_text())["num_steps"] == 6
    environment_log = (run_dir / "logs" / "environment.log").read_text()
    assert "Traceback" not in environment_log
    coordinator_log = _diagnostics(tmp_path, run_dir)
    assert "no environment service was started" not in coordinator_log
    turns = [m["episode/turns/max"] for m in _metrics(run_dir) if "episode/turns/max" in m]
    assert len(turns) == 6 and max(turns) >= 2, turns  # multi-turn episodes, every step


def _metrics(run_dir: Path) -> list[dict]:
    return read_step_lines(run_dir / "metrics.jsonl")  # evaluations' lines left out


def _checkpoints(run_dir: Path) -> list[int]:
    """The steps of the run's complete checkpoints, ascending."""
    done = (run_dir / "checkpoints").glob("step_*/MANIFEST.json")
    return sorted(int(p.parent.name.removeprefix("step_")) for p in done)


def _trained_steps(run_dir: Path) -> int:
    lines = (run_dir / "trained.jsonl").read_text().splitlines()
    return max(json.loads(line)["step"] for line in lines)


def _wait_for_checkpoint(run_dir: Path, after: int, timeout_s: float, diag: str = "") -> int:
    deadline = time.monotonic() + timeout_s
    while not any(s > after for s in _checkpoints(run_dir)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint after step {after} in {timeout_s:.0f}s{diag}")
        time.sleep(0.2)
    return _checkpoints(run_dir)[-1]


NUM_STEPS = 200
PROMPTS_PER_STEP = 32  # the quickstart's


@pytest.mark.slow
def test_scancel_checkpoints_and_a_requeued_job_resumes_exactly_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    """scancel --signal=TERM mid-run: every step stops cleanly, the last trained step
    checkpointed. A new job on the run dir resumes (--resume auto); scontrol requeue kills
    it mid-run (a node failure as the job sees it) and the requeued job resumes from its
    last periodic checkpoint to the end: no prompt lost, none trained twice."""
    cluster = slurm_cluster
    run_dir = tmp_path / "run"
    extra = [f"coordinator.num_steps={NUM_STEPS}", "coordinator.checkpoint_every=10"]
    args = _job_args(cluster, tmp_path, run_dir, extra)
    first = _submit(cluster, tmp_path, args)
    _wait_for_checkpoint(run_dir, 10, 300, _diagnostics(tmp_path, run_dir))
    cluster.run(["scancel", "--signal=TERM", first])
    state = cluster.wait_job(first, DONE, 120)
    assert state == "COMPLETED", f"job {first} {state}" + _diagnostics(tmp_path, run_dir)
    stopped_at = _trained_steps(run_dir)
    assert stopped_at < NUM_STEPS, "the job ended before the scancel"
    assert _checkpoints(run_dir)[-1] == stopped_at  # saved on the way out
    assert (run_dir / "slurm" / "coordinator.exit").read_text().strip() == "0"
    output = next(tmp_path.glob(f"job-{first}.out")).read_text()
    assert "forcing job termination" not in output  # no step was killed
    for step in ("learner0", "rollout0", "reward"):
        assert "Traceback" not in (run_dir / "logs" / f"{step}.log").read_text()

    second = _submit(cluster, tmp_path, args)  # the same run dir: --resume auto continues it
    cluster.wait_job(second, {"RUNNING"}, 120)
    _wait_for_checkpoint(run_dir, stopped_at + 10, 300, _diagnostics(tmp_path, run_dir))
    cluster.run(["scontrol", "requeue", second])
    state = cluster.wait_job(second, DONE, 600)
    assert state == "COMPLETED", f"job {second} {state}" + _diagnostics(tmp_path, run_dir)
    restarts = cluster.run(["scontrol", "-o", "show", "job", second]).stdout
    assert "Restarts=1" in restarts, restarts
    counts = audit(run_dir, NUM_STEPS, PROMPTS_PER_STEP)
    print(f"\nscancel at step {stopped_at}, requeued once; audit {counts}")
    assert counts["lost"] == 0 and counts["doubled"] == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_steps"] == NUM_STEPS


@pytest.mark.slow
def test_usr1_before_the_time_limit_checkpoints_and_ends_the_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    """--signal=USR1@40 with a 1-minute limit: SIGUSR1 comes before it, the job stops after
    its step with a checkpoint and completes instead of timing out."""
    cluster = slurm_cluster
    run_dir = tmp_path / "run"
    args = _job_args(cluster, tmp_path, run_dir, ["coordinator.num_steps=5000"])
    job = _submit(cluster, tmp_path, args, ("--time=1", "--signal=USR1@40"))
    state = cluster.wait_job(job, DONE, 180)
    assert state == "COMPLETED", f"job {job} {state}" + _diagnostics(tmp_path, run_dir)
    stopped_at = _trained_steps(run_dir)
    assert 0 < stopped_at < 5000
    assert _checkpoints(run_dir)[-1] == stopped_at
    assert (run_dir / "slurm" / "coordinator.exit").read_text().strip() == "0"
    # Slurm 22.05 signals the batch step too; a shim's stop file would do the same.
    assert "stopping the job" in (tmp_path / f"job-{job}.out").read_text()


@pytest.mark.slow
def test_a_job_array_sweeps_a_setting_one_run_dir_per_task(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    cluster = slurm_cluster
    runs = tmp_path / "runs"
    args = _job_args(
        cluster, tmp_path, None, ["coordinator.num_steps=3", f"deploy.run_root={runs}"]
    )
    args += ["--sweep", "learner.optimizer.lr=0.0001,0.0003"]
    job = _submit(cluster, tmp_path, args, ("--array=0-1",))
    for task, lr in ((0, 0.0001), (1, 0.0003)):
        run_dir = runs / f"slurm-{job}_{task}"
        state = cluster.wait_job(f"{job}_{task}", DONE, 300)
        assert state == "COMPLETED", f"task {task} {state}" + _diagnostics(tmp_path, run_dir)
        assert json.loads((run_dir / "summary.json").read_text())["num_steps"] == 3
        config = (run_dir / "config.yaml").read_text()
        assert f"lr: {lr}" in config, config


@pytest.mark.slow
def test_a_node_failure_requeues_the_job_and_it_resumes_exactly_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    """The batch node dies mid-run (its slurmd and every process on it): slurmctld marks it
    down and requeues the job (#SBATCH --requeue); once the node is back the job resumes
    from its last periodic checkpoint and finishes, every prompt trained exactly once."""
    cluster = slurm_cluster
    run_dir = tmp_path / "run"
    extra = [f"coordinator.num_steps={NUM_STEPS}", "coordinator.checkpoint_every=10"]
    job = _submit(cluster, tmp_path, _job_args(cluster, tmp_path, run_dir, extra))
    _wait_for_checkpoint(run_dir, 10, 300, _diagnostics(tmp_path, run_dir))
    cluster.fail_node("node1")
    _wait_until(
        lambda: cluster.node_states().get("node1", "").startswith("down"), 120, "node1 down"
    )
    cluster.restart_node("node1")
    state = cluster.wait_job(job, DONE, 600)
    assert state == "COMPLETED", f"job {job} {state}" + _diagnostics(tmp_path, run_dir)
    assert "Restarts=1" in cluster.run(["scontrol", "-o", "show", "job", job]).stdout
    counts = audit(run_dir, NUM_STEPS, PROMPTS_PER_STEP)
    print(f"\nnode failure, requeued once; audit {counts}")
    assert counts["lost"] == 0 and counts["doubled"] == 0


def _wait_until(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.mark.slow
def test_the_tinker_service_serves_from_a_node_and_a_new_job_serves_its_state(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """deploy/configs/tinker.yaml through the sbatch script: the service alone on the first
    node, on its address with TLS; the SDK, here outside the node, trains a LoRA model there
    and saves its state. scancel --batch --signal=TERM stops it cleanly; a new job on the run dir
    serves that state: the model it loads answers as it did before the stop."""
    import tinker
    from tinker import types

    cluster = slurm_cluster
    run_dir = tmp_path / "run"
    cert, key = _certificate(tmp_path, list(cluster.nodes.values()))
    (tmp_path / "keys").write_text("alice tml-alice-key\n")
    args = ["--config", "deploy/configs/tinker.yaml", "--run-dir", str(run_dir)]
    for override in (f"tinker.tls_cert={cert}", f"tinker.tls_key={key}"):
        args += ["--set", override]
    args += ["--set", f"tinker.keys_file={tmp_path / 'keys'}"]
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the SDK (httpx) trusts the test's CA
    batch = [
        types.Datum(
            model_input=types.ModelInput.from_ints([5, 6, 7, 8, 9, 10]),
            loss_fn_inputs={"target_tokens": [6, 7, 8, 9, 10, 11], "weights": [1.0] * 6},
        )
    ]

    def served() -> str:
        _wait_for_file(run_dir / "tinker.addr", 300, "the service's address")
        plan = (run_dir / "slurm" / "plan.txt").read_text().splitlines()
        assert len(plan) == 1 and plan[0].startswith("tinker on node1 -> "), plan
        return "https://" + plan[0].split(" -> ")[1].split(":")[0] + ":8000"

    jobs: list[str] = []
    try:
        jobs.append(_submit(cluster, tmp_path, args))
        url = served()
        assert url == f"https://{cluster.nodes['node1']}:8000"
        with tinker.ServiceClient(base_url=url, api_key="tml-alice-key") as service:
            client = service.create_lora_training_client(base_model="builtin:tiny-qwen3", rank=4)
            client = client.result()
            for _ in range(2):
                client.forward_backward(batch, "cross_entropy").result()
                client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            before = client.forward(batch, "cross_entropy").result().metrics["loss:sum"]
            state = client.save_state("stopped").result().path
        # No srun step to signal: the service runs in the batch step, which --batch signals.
        cluster.run(["scancel", "--batch", "--signal=TERM", jobs[0]])
        ended = cluster.wait_job(jobs[0], DONE, 120)
        assert ended == "COMPLETED", f"job {jobs[0]} {ended}" + _diagnostics(tmp_path, run_dir)
        assert (run_dir / "slurm" / "coordinator.exit").read_text().strip() == "0"
        assert "Traceback" not in (tmp_path / f"job-{jobs[0]}.out").read_text()

        (run_dir / "tinker.addr").unlink()
        jobs.append(_submit(cluster, tmp_path, args))
        with tinker.ServiceClient(base_url=served(), api_key="tml-alice-key") as service:
            loaded = service.create_training_client_from_state(state).result()
            after = loaded.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    finally:  # every job ends, whatever failed: the service must not outlive the test
        for job in jobs:
            if cluster.job_state(job) not in DONE | {""}:
                cluster.run(["scancel", "--batch", "--signal=TERM", job], check=False)
                cluster.wait_job(job, DONE, 120)
    print(f"\ntinker on Slurm: loss {before:.4f} before the stop, {after:.4f} from its state")
    assert after == pytest.approx(before, rel=1e-5)
