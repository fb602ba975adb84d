"""``python -m hybridflow.deploy.launch``: what deploy/launch.sh runs (it ``exec``s this).

Starts every service and the coordinator at once, waits for all their health checks
together (each service with its own deadline; the first to exit or miss it ends the start,
named, and everything started is stopped), hands the coordinator the services' addresses,
and supervises them (see
:mod:`hybridflow.deploy.supervisor`): a dead rollout or reward service is restarted on its
address; a dead learner or coordinator stops the job with one line naming the cause and the
command to resume. Every process started here dies with this one, even when it is SIGKILLed
(:mod:`hybridflow.deploy.lifeline`).

SIGTERM or Ctrl-C: the coordinator (in its own session, so only this process routes
signals to it) gets SIGTERM, finishes its step and saves; it is killed after
``deploy.stop_timeout_s``, then the services get SIGTERM and, after a grace, SIGKILL. A
second SIGTERM / Ctrl-C kills what is left at once.

``--resume RUN_DIR`` (or ``auto``: the newest run under ``deploy.run_root``) starts the job
again in RUN_DIR with the config and overrides of its first launch (``launch.json``) and
passes ``--resume`` to the coordinator. Extra ``--set`` overrides are allowed on resume
(e.g. more steps); they are appended to the saved ones and kept for later resumes. A
different ``--config`` is refused, and so is an override the newest checkpoint cannot
honour (one line naming the key, before any service starts: ``docs/resume.md``).

One job per run directory: the launcher holds ``<run dir>/.lock`` (``run_lock.py``) from
before the preflight to its exit, so a second launch or a ``--resume`` of a live run exits 2
at once naming the holder's pid and host. The run directory and everything the job writes
in it are the user's only (umask 077; ``deploy.group_readable``: 027), set before anything
is created and inherited by every process started here (``run_dir_mode.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hybridflow.deploy.run_lock import RunDirBusy, RunLock, raise_if_busy

if TYPE_CHECKING:
    from hybridflow.job_config import JobConfig

DEFAULT_CONFIG = "deploy/configs/quickstart.yaml"
TOKEN_ENV = "HYBRIDFLOW_TOKEN"
LAUNCH_TIME_ENV = "HYBRIDFLOW_LAUNCH_TIME"
"""time.time() when the launcher started: the coordinator's time to the first trained step
counts from it (``RunSummary.time_to_first_step_s``)."""

log = logging.getLogger("launch")


class LaunchError(Exception):
    """A problem with the command line or the run dir, reported as one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deploy/launch.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help=f"job YAML (default {DEFAULT_CONFIG})")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override for every process (repeatable)",
    )
    parser.add_argument("--run-dir", help="output directory (default: runs/<timestamp>)")
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR|auto",
        help="continue the run in RUN_DIR (auto: the newest under deploy.run_root)",
    )
    return parser


def resolve_launch(args: argparse.Namespace) -> tuple[str, list[str], Path | None]:
    """(config path, overrides, run dir or None for a new timestamped one) for this launch;
    RunDirBusy when ``--resume`` names a run that is still running."""
    if not args.resume:
        run_dir = Path(args.run_dir) if args.run_dir else None
        if run_dir is not None and (run_dir / "config.yaml").is_file():
            raise_if_busy(run_dir)  # a live run is reported as live first
            raise LaunchError(
                f"--run-dir {run_dir} already holds a run (its config.yaml): continue it with "
                f"deploy/launch.sh --resume {run_dir}, or give a new --run-dir"
            )
        return args.config or DEFAULT_CONFIG, list(args.set), run_dir
    if args.run_dir:
        raise LaunchError("give --resume RUN_DIR or --run-dir, not both")
    if args.resume == "auto":
        from hybridflow.job_config import load_job_config

        root = Path(load_job_config(args.config or DEFAULT_CONFIG, args.set).deploy.run_root)
        run_dir = newest_run(root)
        if run_dir is None:
            raise LaunchError(f"--resume auto: no run with a launch.json under {root}")
    else:
        run_dir = Path(args.resume)
    if not run_dir.is_dir():
        raise LaunchError(f"--resume: {run_dir} is not a directory")
    raise_if_busy(run_dir)  # a live run is reported as live, whatever it has written yet
    if not (run_dir / "config.yaml").is_file():
        raise LaunchError(
            f"--resume: {run_dir}/config.yaml not found (its coordinator never started); "
            "launch it afresh"
        )
    launch_file = run_dir / "launch.json"
    if launch_file.is_file():
        saved = json.loads(launch_file.read_text())
        config, overrides = saved["config"], list(saved["overrides"])
    else:  # a run from before launch.json: its resolved config stands in for both
        config, overrides = str(run_dir / "config.yaml"), []
    if args.config and args.config != config:
        raise LaunchError(
            f"--resume: {run_dir} was launched with --config {config}, not {args.config} "
            "(drop --config; extra --set overrides are allowed)"
        )
    return config, [*overrides, *args.set], run_dir


def newest_run(root: Path) -> Path | None:
    """The run under ``root`` whose launch.json was written last (every launch rewrites it)."""
    runs = [p.parent for p in root.glob("*/launch.json")]
    return max(runs, key=lambda p: (p / "launch.json").stat().st_mtime, default=None)


def write_launch_record(run_dir: Path, config: str, overrides: list[str], resume: bool) -> None:
    """Saves what this launch used so ``--resume`` repeats it; one entry per launch."""
    path = run_dir / "launch.json"
    launches = json.loads(path.read_text())["launches"] if path.is_file() else []
    launches.append({"time": time.time(), "resume": resume, "pid": os.getpid()})
    record = {"config": config, "overrides": overrides, "launches": launches}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def _run_token_env(run_dir: Path) -> dict[str, str]:
    """The per-run auth token every child gets: none to add when ``HYBRIDFLOW_TOKEN`` is
    already set (own deployments); else ``run_dir/token`` (mode 0600), created on the first
    launch and reused on resume."""
    from hybridflow.rpc.token import export_run_token

    if os.environ.get(TOKEN_ENV):
        return {}
    env: dict[str, str] = {}
    try:
        export_run_token(run_dir, env, TOKEN_ENV)
    except (ValueError, OSError) as exc:
        raise LaunchError(str(exc)) from None
    return env


def claim_run_dir(run_dir: Path, job: JobConfig, resume: bool) -> RunLock:
    """Creates ``run_dir`` with the run's mode and takes its lock, held until this process
    exits (RunDirBusy naming the live job's launcher otherwise); on resume, checks the
    config against the newest checkpoint's (ResumeRefused naming a key it cannot honour)
    before any service starts."""
    from hybridflow.coordinator.checkpoint_config import check_resume_config
    from hybridflow.deploy.run_dir_mode import prepare_run_dir
    from hybridflow.deploy.run_lock import lock_run_dir

    prepare_run_dir(run_dir, job.deploy.group_readable)
    lock = lock_run_dir(run_dir)
    if resume:
        check_resume_config(run_dir, job)
    return lock


def send_addresses(coordinator: subprocess.Popen[bytes], overrides: list[str]) -> None:
    """Hands the services' addresses (``--set`` overrides) to a coordinator started with
    ``--addresses-from-stdin``: one JSON line, then EOF."""
    assert coordinator.stdin is not None
    try:
        coordinator.stdin.write((json.dumps(overrides) + "\n").encode())
        coordinator.stdin.close()
    except BrokenPipeError:
        pass  # it already exited: the supervisor reports its exit code


def stop_unstarted(coordinator: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """Ends a coordinator that was still waiting for the services (nothing to save yet)."""
    if coordinator.poll() is None:
        coordinator.terminate()
        try:
            coordinator.wait(grace_s)
        except subprocess.TimeoutExpired:
            coordinator.kill()
    coordinator.wait()


def main(argv: list[str] | None = None) -> int:
    launch_time = time.time()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launch %(levelname)s: %(message)s")
    named = args.run_dir or (args.resume if args.resume != "auto" else None)
    try:
        if named:  # a live run is refused before the config is even imported: well under 1 s
            raise_if_busy(Path(named))
    except RunDirBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from hybridflow.config.loader import ConfigError
    from hybridflow.coordinator.checkpoint_config import ResumeRefused
    from hybridflow.deploy.preflight import check_job, config_problems, report
    from hybridflow.deploy.run_dir_mode import run_umask
    from hybridflow.job_config import load_job_config

    try:
        config_path, overrides, run_dir_arg = resolve_launch(args)
        job = load_job_config(config_path, overrides)
    except (LaunchError, RunDirBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ConfigError:
        return report(config_problems(config_path, overrides))  # every problem, exit 2
    run_dir = run_dir_arg or Path(job.deploy.run_root) / time.strftime("%Y%m%d_%H%M%S")
    resume = bool(args.resume)
    os.umask(run_umask(job.deploy.group_readable))  # before anything is written; children too
    lock: RunLock | None = None
    try:
        if run_dir.exists():  # a live job's run dir: refused at once, before the preflight
            lock = claim_run_dir(run_dir, job, resume)
        if report(check_job(job)):  # ports, model, TLS files, data: before any service starts
            return 2
        if lock is None:  # a new run dir: created only once the preflight passed
            lock = claim_run_dir(run_dir, job, resume)
    except (RunDirBusy, ResumeRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log.debug("run dir %s locked by %s", run_dir, lock.holder.describe())
    try:
        env = _run_token_env(run_dir)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_launch_record(run_dir, config_path, overrides, resume)
    if not job.learner.checkpoint_dir:  # the only place checkpoint RPCs may write
        overrides = [*overrides, f"learner.checkpoint_dir={(run_dir / 'checkpoints').resolve()}"]
    if job.preference.data:  # learner-only offline job (hybridflow/preference)
        from hybridflow.preference.launch import run_preference_job

        return run_preference_job(job, config_path, overrides, run_dir, env)

    from hybridflow.deploy.launcher import ServiceGroup
    from hybridflow.deploy.lifeline import launcher_env
    from hybridflow.deploy.supervisor import EventLog, Supervisor
    from hybridflow.models import resolve_model_path

    env.update(launcher_env())
    env[LAUNCH_TIME_ENV] = repr(launch_time)
    resume_hint = f"resume with: deploy/launch.sh --resume {run_dir}"
    group = ServiceGroup(job, config_path, overrides, run_dir, env=env)
    phase = ["starting"]
    supervisor: list[Supervisor] = []

    def on_signal(signum: int, _frame: object) -> None:
        if phase[0] == "starting":
            phase[0] = "stopping"
            raise KeyboardInterrupt  # abort the start; the finally-block stops services
        if phase[0] == "running" and supervisor:
            supervisor[0].request_stop()
            if supervisor[0].num_stop_requests < 2:
                return
        group.kill_now = True  # a second request, or one while stopping: kill the rest now

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    coordinator: subprocess.Popen[bytes] | None = None
    try:
        log.info(
            "model %s -> %s", job.model, resolve_model_path(job.model)
        )  # copies a builtin into the cache once
        group.start()
        # The coordinator starts alongside the services: its imports, tokenizer and dataset
        # overlap their start; it reads their addresses from stdin once they all serve.
        cmd = [sys.executable, "-m", "hybridflow.coordinator", "run"]
        cmd += ["--config", config_path, "--run-dir", str(run_dir), "--addresses-from-stdin"]
        for override in overrides:
            cmd += ["--set", override]
        if resume:
            cmd.append("--resume")
        # Own session: Ctrl-C reaches only this process, which forwards exactly one SIGTERM.
        coordinator = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, env={**os.environ, **env}, start_new_session=True
        )
        log.info(
            "waiting for %d services and the coordinator (logs in %s/logs)",
            len(group.processes),
            run_dir,
        )
        try:
            addresses = group.wait_ready(
                job.deploy.health_timeout_s, watch=[("coordinator", coordinator)]
            )
        except (RuntimeError, TimeoutError) as exc:
            phase[0] = "stopping"
            log.error("%s", exc)
            return 1
        log.info("services ready: %s", ", ".join(f"{k}={v}" for k, v in addresses.items()))
        send_addresses(coordinator, group.address_overrides())
        deploy = job.deploy
        supervisor.append(
            Supervisor(
                group,
                coordinator,
                EventLog(run_dir / "supervisor.jsonl"),
                restart_budget=deploy.restart_budget,
                restart_backoff_s=deploy.restart_backoff_s,
                stop_timeout_s=deploy.stop_timeout_s,
                health_timeout_s=deploy.health_timeout_s,
            )
        )
        phase[0] = "running"
        outcome = supervisor[0].run()
        phase[0] = "stopping"
        usage = group.resource_usage()
        try:
            (run_dir / "service_usage.json").write_text(json.dumps(usage, indent=2) + "\n")
        except OSError as exc:  # a full disk must not hide the outcome and the resume hint
            from hybridflow.utils.disk import describe_write_error

            log.error("service_usage.json not written: %s", describe_write_error(run_dir, exc))
        log.info("coordinator exited with %d; stopping services", coordinator.returncode)
    except KeyboardInterrupt:
        log.warning("interrupted before the services were ready; stopping them")
        return 130
    finally:
        phase[0] = "stopping"
        if coordinator is not None and not supervisor:  # never handed to the supervisor
            stop_unstarted(coordinator)
        group.stop()
    if outcome.cause is not None:
        print(f"{outcome.cause}; {resume_hint}", file=sys.stderr)
        return 1
    if outcome.stopped_by_request:
        print(f"stopped on request; {resume_hint}", file=sys.stderr)
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
