"""``python -m hybridflow.deploy.launch``: what deploy/launch.sh runs (it ``exec``s this).

Starts every service and the coordinator at once, waits for all their health checks
together (each service with its own deadline; the first to exit or miss it ends the start,
named, and everything started is stopped), hands the coordinator the services' addresses,
and supervises them (see
:mod:`hybridflow.deploy.supervisor`): a dead rollout, reward or environment service is
restarted on its address; a dead learner or coordinator stops the job with one line naming the cause and the
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hybridflow.deploy.run_lock import RunDirBusy, RunLock, raise_if_busy
from hybridflow.utils.config_args import add_config_args

if TYPE_CHECKING:
    from hybridflow.deploy.launcher import ServiceGroup
    from hybridflow.deploy.supervisor import Outcome, Supervisor
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
    # The overrides reach every process of the job.
    add_config_args(parser, f"job YAML (default {DEFAULT_CONFIG})", "coordinator.num_steps=10")
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
        checkpoints = job.learner.checkpoint_dir or run_dir / "checkpoints"
        check_resume_config(Path(checkpoints), asdict(job))
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


def coordinator_command(
    job: JobConfig, config_path: str, overrides: list[str], run_dir: Path, resume: bool
) -> list[str]:
    """The plan's coordinator, reading the services' addresses from its stdin
    (:func:`send_addresses`) once they all serve."""
    from hybridflow.job.plan import config_args, plan, python_command

    cmd = python_command(sys.executable, plan(job).main, job.learner)
    cmd += ["--run-dir", str(run_dir), "--addresses-from-stdin"]
    return [*cmd, *config_args(config_path, overrides), *(["--resume"] if resume else [])]


def stop_unstarted(coordinator: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """Ends a coordinator that was still waiting for the services (nothing to save yet)."""
    if coordinator.poll() is None:
        coordinator.terminate()
        try:
            coordinator.wait(grace_s)
        except subprocess.TimeoutExpired:
            coordinator.kill()
    coordinator.wait()


class _Exit(Exception):
    """Ends ``main`` with exit ``code`` once ``lines`` are printed to stderr."""

    def __init__(self, code: int, *lines: str) -> None:
        super().__init__(code)
        self.code, self.lines = code, lines


@dataclass
class _Launch:
    """What this launch runs, settled before any process starts: the config and overrides
    every process gets, the loaded job, its run dir (locked by ``lock`` for this process's
    life), whether it resumes, and what the children's environment adds."""

    config_path: str
    overrides: list[str]
    job: JobConfig
    run_dir: Path
    resume: bool
    lock: RunLock
    env: dict[str, str]


class _Run:
    """The state the launcher's signal handler reads while the services run: the phase
    (``starting``, ``running``, ``stopping``), the service group, the coordinator once
    started and the supervisor once it has taken over."""

    def __init__(self, group: ServiceGroup) -> None:
        self.group = group
        self.phase = "starting"
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.supervisor: Supervisor | None = None

    def on_signal(self, signum: int, _frame: object) -> None:
        """SIGINT / SIGTERM: while starting, abort the start; while running, the first asks
        the supervisor to stop; a second, or one while stopping, kills what is left."""
        if self.phase == "starting":
            self.phase = "stopping"
            raise KeyboardInterrupt  # abort the start; the finally-block stops services
        if self.phase == "running" and self.supervisor is not None:
            self.supervisor.request_stop()
            if self.supervisor.num_stop_requests < 2:
                return
        self.group.kill_now = True  # a second request, or one while stopping: kill the rest now


def main(argv: list[str] | None = None) -> int:
    """deploy/launch.sh: settles and claims the launch (exit 2 for anything refused, before
    any process starts), then runs it: the learner-only preference job or the Tinker-compatible
    service (one process each), or the services and the coordinator under supervision. Returns the exit code."""
    launch_time = time.time()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launch %(levelname)s: %(message)s")
    try:
        launch = _prepare(args)
    except _Exit as done:
        for line in done.lines:
            print(line, file=sys.stderr)
        return done.code
    if launch.job.preference.data or launch.job.tinker.enabled:  # one process: no services
        from hybridflow.deploy.one_process_job import run_one_process_job

        return run_one_process_job(
            launch.job, launch.config_path, launch.overrides, launch.run_dir, launch.env
        )
    return _run_services(launch, launch_time)


def _prepare(args: argparse.Namespace) -> _Launch:
    """The launch, in this order: a live named run refused (before the config is even
    imported), the config loaded, the umask set, the run dir claimed around the preflight,
    the run token, ``launch.json`` written and the checkpoint dir defaulted into it.
    ``_Exit`` for anything refused."""
    named = args.run_dir or (args.resume if args.resume != "auto" else None)
    try:
        if named:  # a live run is refused before the config is even imported: well under 1 s
            raise_if_busy(Path(named))
    except RunDirBusy as exc:
        raise _Exit(2, f"error: {exc}") from exc

    from hybridflow.deploy.run_dir_mode import run_umask

    config_path, overrides, run_dir_arg, job = _load(args)
    run_dir = run_dir_arg or Path(job.deploy.run_root) / time.strftime("%Y%m%d_%H%M%S")
    resume = bool(args.resume)
    os.umask(run_umask(job.deploy.group_readable))  # before anything is written; children too
    lock = _claim(run_dir, job, resume)
    log.debug("run dir %s locked by %s", run_dir, lock.holder.describe())
    try:
        env = _run_token_env(run_dir)
    except LaunchError as exc:
        raise _Exit(2, f"error: {exc}") from exc
    write_launch_record(run_dir, config_path, overrides, resume)
    if not job.learner.checkpoint_dir:  # the only place checkpoint RPCs may write
        overrides = [*overrides, f"learner.checkpoint_dir={(run_dir / 'checkpoints').resolve()}"]
    return _Launch(config_path, overrides, job, run_dir, resume, lock, env)


def _load(args: argparse.Namespace) -> tuple[str, list[str], Path | None, JobConfig]:
    """The launch's config path, overrides and named run dir (:func:`resolve_launch`) and
    its job config; ``_Exit`` 2 for a refused command line or a live run, and every config
    problem (one line each) for a config that does not load."""
    from hybridflow.config.loader import ConfigError
    from hybridflow.deploy.preflight import config_problems, report
    from hybridflow.job_config import load_job_config

    # Until resolve_launch answers, a bad config is the command line's (--resume auto loads it).
    config_path, overrides = args.config or DEFAULT_CONFIG, list(args.set)
    try:
        config_path, overrides, run_dir_arg = resolve_launch(args)
        job = load_job_config(config_path, overrides)
    except (LaunchError, RunDirBusy) as exc:
        raise _Exit(2, f"error: {exc}") from exc
    except ConfigError:
        raise _Exit(report(config_problems(config_path, overrides))) from None  # exit 2
    return config_path, overrides, run_dir_arg, job


def _claim(run_dir: Path, job: JobConfig, resume: bool) -> RunLock:
    """The run dir's lock, taken around the preflight (ports, model, TLS files, data): an
    existing run dir is claimed first, so a live job's is refused at once; a new one is
    created only once the preflight passed. ``_Exit`` 2 for a live run, a failed preflight
    or a resume the newest checkpoint cannot honour."""
    from hybridflow.coordinator.checkpoint_config import ResumeRefused
    from hybridflow.deploy.preflight import check_job, report

    lock: RunLock | None = None
    try:
        if run_dir.exists():  # a live job's run dir: refused at once, before the preflight
            lock = claim_run_dir(run_dir, job, resume)
        if report(check_job(job)):  # ports, model, TLS files, data: before any service starts
            raise _Exit(2)
        if lock is None:  # a new run dir: created only once the preflight passed
            lock = claim_run_dir(run_dir, job, resume)
    except (RunDirBusy, ResumeRefused) as exc:
        raise _Exit(2, f"error: {exc}") from exc
    return lock


def _run_services(launch: _Launch, launch_time: float) -> int:
    """Starts the services and the coordinator, waits until all serve, supervises them to
    the end and reports the outcome. Owns SIGINT / SIGTERM from here on (``_Run``) and the
    cleanup every path goes through once a process may have started: a coordinator never
    handed to the supervisor is stopped, then every service. Exit 1 when the start fails,
    130 when interrupted before the services were ready."""
    from hybridflow.deploy.launcher import ServiceGroup
    from hybridflow.deploy.lifeline import launcher_env
    from hybridflow.utils.startup_marks import ENV as STARTUP_LOG_ENV
    from hybridflow.utils.startup_marks import mark

    env = launch.env
    env.update(launcher_env())
    env[LAUNCH_TIME_ENV] = repr(launch_time)
    # Every process marks the phases of its start here (benchmarks/startup/phases.py).
    os.environ[STARTUP_LOG_ENV] = str((launch.run_dir / "startup.jsonl").resolve())
    mark("launcher", "start", at=launch_time, cpu_s=0.0)
    mark("launcher", "prepared")  # config, preflight, run dir, token
    run = _Run(
        ServiceGroup(launch.job, launch.config_path, launch.overrides, launch.run_dir, env=env)
    )
    signal.signal(signal.SIGINT, run.on_signal)
    signal.signal(signal.SIGTERM, run.on_signal)
    try:
        coordinator = _start(launch, run)
        if not _wait_ready(launch, run, coordinator):
            return 1
        outcome = _supervise(launch, run, coordinator)
    except KeyboardInterrupt:
        log.warning("interrupted before the services were ready; stopping them")
        return 130
    finally:
        run.phase = "stopping"
        if run.coordinator is not None and run.supervisor is None:  # never handed over
            stop_unstarted(run.coordinator)
        run.group.stop()
        mark("launcher", "stopped")
    return _report(outcome, launch.run_dir)


def _start(launch: _Launch, run: _Run) -> subprocess.Popen[bytes]:
    """Starts every service, then the coordinator alongside them (``run.coordinator`` from
    the moment it exists): its imports, tokenizer and dataset overlap the services' start;
    it reads their addresses from stdin once they all serve."""
    from hybridflow.models import resolve_model_path

    job, run_dir = launch.job, launch.run_dir
    log.info(
        "model %s -> %s", job.model, resolve_model_path(job.model)
    )  # copies a builtin into the cache once
    run.group.start()
    cmd = coordinator_command(job, launch.config_path, launch.overrides, run_dir, launch.resume)
    from hybridflow.deploy.dataset_stamp import checked_env

    # checked_env: the dataset this preflight validated, so the coordinator need not again.
    env = {**os.environ, **launch.env, **checked_env(launch.job)}
    # Own session: Ctrl-C reaches only this process, which forwards exactly one SIGTERM.
    run.coordinator = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, start_new_session=True)
    from hybridflow.utils.startup_marks import mark

    mark("launcher", "spawned")
    log.info(
        "waiting for %d services and the coordinator (logs in %s/logs)",
        len(run.group.processes),
        run_dir,
    )
    return run.coordinator


def _wait_ready(launch: _Launch, run: _Run, coordinator: subprocess.Popen[bytes]) -> bool:
    """Waits for every service's health check (each with its own deadline) while watching
    the coordinator, then hands it their addresses; False (the failure logged, the phase
    ``stopping``) when one exits or misses its deadline first."""
    try:
        addresses = run.group.wait_ready(
            launch.job.deploy.health_timeout_s, watch=[("coordinator", coordinator)]
        )
    except (RuntimeError, TimeoutError) as exc:
        run.phase = "stopping"
        log.error("%s", exc)
        return False
    from hybridflow.utils.startup_marks import mark

    log.info("services ready: %s", ", ".join(f"{k}={v}" for k, v in addresses.items()))
    send_addresses(coordinator, run.group.address_overrides())
    mark("launcher", "addresses_sent")
    return True


def _supervise(launch: _Launch, run: _Run, coordinator: subprocess.Popen[bytes]) -> Outcome:
    """Hands the job to the supervisor (restarts, stop requests; phase ``running``) until
    the coordinator exits, then records the services' resource usage."""
    from hybridflow.deploy.supervisor import EventLog, Supervisor

    run_dir, deploy = launch.run_dir, launch.job.deploy
    run.supervisor = Supervisor(
        run.group,
        coordinator,
        EventLog(run_dir / "supervisor.jsonl"),
        restart_budget=deploy.restart_budget,
        restart_backoff_s=deploy.restart_backoff_s,
        stop_timeout_s=deploy.stop_timeout_s,
        health_timeout_s=deploy.health_timeout_s,
    )
    from hybridflow.utils.startup_marks import mark

    run.phase = "running"
    outcome = run.supervisor.run()
    mark("launcher", "coordinator_exited")
    run.phase = "stopping"
    _write_usage(run.group, run_dir)
    log.info("coordinator exited with %d; stopping services", coordinator.returncode)
    return outcome


def _write_usage(group: ServiceGroup, run_dir: Path) -> None:
    """The services' resource usage to ``service_usage.json``; a failed write is logged."""
    usage = group.resource_usage()
    try:
        (run_dir / "service_usage.json").write_text(json.dumps(usage, indent=2) + "\n")
    except OSError as exc:  # a full disk must not hide the outcome and the resume hint
        from hybridflow.utils.disk import describe_write_error

        log.error("service_usage.json not written: %s", describe_write_error(run_dir, exc))


def _report(outcome: Outcome, run_dir: Path) -> int:
    """The job's end on stderr, once every process is stopped: its cause or a stop on
    request, with the command to resume; the exit code (1 for a cause, else the
    coordinator's)."""
    resume_hint = f"resume with: deploy/launch.sh --resume {run_dir}"
    if outcome.cause is not None:
        print(f"{outcome.cause}; {resume_hint}", file=sys.stderr)
        return 1
    if outcome.stopped_by_request:
        print(f"stopped on request; {resume_hint}", file=sys.stderr)
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
