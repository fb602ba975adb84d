"""``hybridflow-coordinator run``: connect to the services, load data, run the job.

Under deploy/launch.sh the coordinator starts alongside the services
(``addresses_from_stdin``): it loads its tokenizer and dataset while they start, then reads
their addresses from the launcher. Its config file is parsed once (the addresses are
overrides on it); its dataset is read once to load it, and to validate it too only when the
launcher's preflight did not validate that very file (``deploy/dataset_stamp.py``). Time to
the first trained step counts from the launcher's start (``HYBRIDFLOW_LAUNCH_TIME``), else
from this process's.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from hybridflow.coordinator.config import CoordinatorConfig

if TYPE_CHECKING:
    from hybridflow.coordinator.control import JobControl
    from hybridflow.coordinator.evaluation import EvalSet
    from hybridflow.coordinator.run_records import RunSummary
    from hybridflow.coordinator.services import Services
    from hybridflow.data.datasets import PromptDataset
    from hybridflow.job_config import JobConfig

log = logging.getLogger("coordinator")

LAUNCH_TIME_ENV = "HYBRIDFLOW_LAUNCH_TIME"  # set by hybridflow.deploy.launch


def launch_time(started_at: float, environ: dict[str, str] | None = None) -> float:
    """Where time to the first trained step counts from: the launcher's start when it set
    ``HYBRIDFLOW_LAUNCH_TIME``, else ``started_at`` (this process's)."""
    raw = (os.environ if environ is None else environ).get(LAUNCH_TIME_ENV, "")
    try:
        return float(raw) if raw else started_at
    except ValueError:
        log.warning("ignoring %s=%r: not a time", LAUNCH_TIME_ENV, raw)
        return started_at


def read_address_overrides(stream: TextIO) -> list[str]:
    """The launcher's one JSON line of ``--set`` overrides naming the services' addresses;
    ValueError when the launcher closed the pipe without one (its start failed)."""
    line = stream.readline()
    if not line.strip():
        raise ValueError("the launcher closed stdin before sending the services' addresses")
    overrides = json.loads(line)
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(f"expected a JSON list of KEY=VALUE strings on stdin, got {line!r}")
    return overrides


class _Exit(Exception):
    """Ends ``run_job`` with exit ``code`` once ``lines`` are printed to stderr."""

    def __init__(self, code: int, *lines: str) -> None:
        super().__init__(code)
        self.code, self.lines = code, lines


@dataclass
class _Prepared:
    """What the job needs before it meets any service: its config, run dir (locked for this
    process's life), tokenizer and dataset."""

    job: JobConfig
    run_dir: Path
    run_lock: object
    tokenizer: Any
    dataset: PromptDataset
    eval_sets: list[EvalSet]
    """The held-out sets of ``coordinator.eval``."""


def run_job(
    config_path: str | None,
    overrides: list[str],
    run_dir_arg: str | None = None,
    resume: bool = False,
    addresses_from_stdin: bool = False,
    started_at: float | None = None,
) -> int:
    """Runs (``resume``: continues from the newest complete checkpoint in the run dir) the
    job; returns the exit code: 0 done, 1 failed (one line names the cause), 2 bad config.
    ``addresses_from_stdin``: the services' addresses arrive on stdin after the tokenizer
    and dataset are loaded (see :func:`read_address_overrides`). In parts: prepare, connect,
    serve the control API, train, report."""
    origin = launch_time(time.time() if started_at is None else started_at)
    from hybridflow.deploy.lifeline import watch_parent
    from hybridflow.utils.startup_gc import pause_collection, resume_collection
    from hybridflow.utils.startup_marks import mark, mark_process_start

    pause_collection()  # until the tokenizer's imports are done (_prepare)
    mark_process_start("coordinator")

    watch_parent()  # under deploy/launch.sh: end when the launcher does
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack to stderr
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s coordinator %(levelname)s: %(message)s"
    )
    try:
        try:
            prepared = _prepare(config_path, overrides, run_dir_arg, addresses_from_stdin)
        finally:
            resume_collection()  # also when the preparation is refused
        services, close_clients = _connect(prepared)
        mark("coordinator", "connected")
        try:
            control, server = _serve_control(prepared)
            mark("coordinator", "control_serving")
            try:
                summary = _train(prepared, services, control, resume, origin)
            finally:
                server.stop(1.0)
        finally:
            close_clients()
    except _Exit as done:
        for line in done.lines:
            print(line, file=sys.stderr)
        return done.code
    _report(summary, prepared.run_dir)
    mark("coordinator", "report_drawn")
    return 0


def _prepare(
    config_path: str | None,
    overrides: list[str],
    run_dir_arg: str | None,
    addresses_from_stdin: bool,
) -> _Prepared:
    """The config (checked by preflight), the run dir (made private, locked), the tokenizer
    and the dataset; under the launcher, then the services' addresses from stdin, applied as
    overrides to the config loaded first (its file is parsed once; the checks and messages
    are those of loading it with the addresses appended). The resolved config is written to
    the run dir. ``_Exit`` for anything refused."""
    from hybridflow.config.loader import ConfigError, dump_yaml
    from hybridflow.deploy.preflight import coordinator_problems, report
    from hybridflow.deploy.run_dir_mode import prepare_run_dir
    from hybridflow.deploy.run_lock import RunDirBusy, acquire_unless_parent_holds
    from hybridflow.job_config import load_job_config, override_job_config
    from hybridflow.models import resolve_model_path
    from hybridflow.models.text_only import load_tokenizer
    from hybridflow.utils.startup_gc import resume_collection
    from hybridflow.utils.startup_marks import mark

    mark("coordinator", "imported")
    try:
        job = load_job_config(config_path, overrides)
    except ConfigError as exc:
        raise _Exit(2, f"config error: {exc}") from exc
    # Its port (the services hold theirs), model, TLS files; the dataset unless the
    # launcher's preflight checked this very file (preflight.coordinator_problems).
    if report(coordinator_problems(job)):
        raise _Exit(2)
    if not addresses_from_stdin and _report_missing_addresses(job.coordinator):
        raise _Exit(2)
    run_dir = (
        Path(run_dir_arg)
        if run_dir_arg
        else Path(job.deploy.run_root) / time.strftime("%Y%m%d_%H%M%S")
    )
    prepare_run_dir(run_dir, job.deploy.group_readable)  # 0700 / 0600 unless group-readable
    try:
        # Started by hand: one job per run dir, as under the launcher (which then holds it).
        # Held until this process exits; the kernel drops it, whatever the exit.
        run_lock = acquire_unless_parent_holds(run_dir)
    except RunDirBusy as exc:
        raise _Exit(2, f"error: {exc}") from exc
    mark("coordinator", "config_checked")  # and the run dir locked
    model_dir = resolve_model_path(job.model)
    tokenizer = load_tokenizer(model_dir)  # no torch in this process
    resume_collection()  # before the dataset is read
    mark("coordinator", "tokenizer")
    try:
        dataset = load_dataset(job.coordinator, model_dir, tokenizer)
        eval_sets = load_eval_sets(job.coordinator, model_dir, tokenizer)
    except ValueError as exc:  # every prompt over the limit, or the model has no room
        raise _Exit(2, f"data error: {exc}") from exc
    mark("coordinator", "dataset")
    if addresses_from_stdin:
        try:  # the file is read once: the addresses go onto the job loaded above
            job = override_job_config(job, config_path, read_address_overrides(sys.stdin))
        except ConfigError as exc:
            raise _Exit(2, f"config error: {exc}") from exc
        except ValueError as exc:
            raise _Exit(1, f"error: {exc}") from exc
        if _report_missing_addresses(job.coordinator):
            raise _Exit(2)
        mark("coordinator", "addresses")
    dump_yaml(job, run_dir / "config.yaml")
    return _Prepared(job, run_dir, run_lock, tokenizer, dataset, eval_sets)


def _connect(prepared: _Prepared) -> tuple[Services, Callable[[], None]]:
    """Waits for every service's health check, then its clients; and how to close them."""
    from hybridflow.coordinator.services import Services
    from hybridflow.rpc.channel import wait_healthy
    from hybridflow.services.learner.client import GrpcLearnerClient
    from hybridflow.services.reward.client import GrpcRewardClient
    from hybridflow.services.rollout.client import GrpcRolloutClient

    job, cfg, tokenizer = prepared.job, prepared.job.coordinator, prepared.tokenizer
    addresses = [*cfg.rollout_addresses, cfg.reward_address, cfg.learner_address]
    if cfg.multi_turn.enabled and cfg.environment_address:
        addresses.append(cfg.environment_address)
    for address in addresses:
        wait_healthy(address, job.deploy.health_timeout_s, config=cfg.channel)
    rollouts = [GrpcRolloutClient(a, cfg.channel) for a in cfg.rollout_addresses]
    reward = GrpcRewardClient(cfg.reward_address, cfg.channel)
    learner = GrpcLearnerClient(cfg.learner_address, cfg.channel)
    services = Services(
        rollouts=list(rollouts),
        reward=reward,
        learner=learner,
        weight_targets=list(cfg.rollout_addresses),
        decode=lambda ids: str(tokenizer.decode(ids.tolist(), skip_special_tokens=True)),
        environments=_environments(job),
        tokenizer=tokenizer,
        # scale: a replica added to the running job, reached like the launched ones
        connect_rollout=lambda address: GrpcRolloutClient(address, cfg.channel),
    )

    def close() -> None:
        for rollout in services.rollouts:  # the launched replicas and those added since
            rollout.close()  # type: ignore[attr-defined]  # GrpcRolloutClients, all of them
        reward.close()
        learner.close()
        shutdown = getattr(services.environments, "shutdown", None)
        if shutdown is not None:  # the service's client: its channel
            shutdown()

    return services, close


def _environments(job: JobConfig) -> Any:
    """The episodes' environments (multi-turn only): the environment service's client when
    the launcher started one (``coordinator.environment_address``), else in this process
    (said loudly when the job lists environment classes for a service nobody started)."""
    cfg = job.coordinator
    if not cfg.multi_turn.enabled:
        return None
    if job.environment.enabled and not cfg.environment_address:
        log.warning(
            "environment.envs lists %s, but no environment service was started for this job "
            "(coordinator.environment_address is empty): the episodes run inside the "
            "coordinator, without the service's supervision and bounds",
            list(job.environment.envs),
        )
    from hybridflow.services.environment.factory import make_environment_client

    return make_environment_client(
        cfg.environment_address, cfg.channel, agent_timeout_s=job.environment.agent_timeout_s
    )


def _serve_control(prepared: _Prepared) -> tuple[JobControl, Any]:
    """The job's control (status, pause, stop) over gRPC, its port file and metrics, and
    SIGINT / SIGTERM: stop after the current step (a second one aborts)."""
    from hybridflow.coordinator.control import JobControl
    from hybridflow.coordinator.servicer import SERVICE_NAME, CoordinatorServicer
    from hybridflow.rpc.server import start_server, write_port_file

    cfg, run_dir = prepared.job.coordinator, prepared.run_dir
    control = JobControl(cfg.num_steps, str(run_dir.resolve()))
    servicer = CoordinatorServicer(control)
    server = start_server(
        cfg.server,
        servicer.add_to_server,
        [SERVICE_NAME],
    )
    if server.metrics is not None:
        server.metrics.gauge(
            "hybridflow_policy_version",
            "Policy version of the last trained step",
            lambda: control.status().policy_version,
        )
        server.metrics.gauge(
            "hybridflow_coordinator_step", "Last trained step", lambda: control.status().step
        )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if control.status().state == "stopping":
            raise KeyboardInterrupt
        print("\nstopping after the current step (Ctrl-C again to abort)", file=sys.stderr)
        control.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # After the handlers: whoever waits for this file may signal at once (the Slurm batch
    # step holds its stop requests until it is there).
    write_port_file(run_dir / "coordinator.addr", server.address)
    print(
        f"run dir: {run_dir}  (control: hybridflow-coordinator status --run-dir {run_dir})",
        file=sys.stderr,
    )
    return control, server


def _train(
    prepared: _Prepared, services: Services, control: JobControl, resume: bool, origin: float
) -> RunSummary:
    """The schedule itself (``TrainingJob``), set by what the learner says it needs; a
    refused resume or checkpoint exits 2, a failed job 1 (with the report drawn so far and
    the resume command)."""
    from hybridflow.coordinator.checkpoint_config import ResumeRefused
    from hybridflow.coordinator.job import TrainingJob
    from hybridflow.coordinator.report import write_report_logged
    from hybridflow.errors import CheckpointRejected

    job, run_dir = prepared.job, prepared.run_dir
    checkpoint_root = Path(job.learner.checkpoint_dir) if job.learner.checkpoint_dir else None
    if checkpoint_root is None:
        log.warning("learner.checkpoint_dir is not set: no checkpoints, no resume")
    try:
        # Asked once: the learner's config fixes them for the whole run.
        needs = services.learner.schedule_needs()
        if needs.greedy_baseline:
            log.info("the learner's estimator needs greedy baselines: one greedy reply per prompt")
        if needs.routed_experts:
            log.info("the learner replays MoE routing: the rollout reports routed experts")
        training = TrainingJob(
            job.coordinator,
            services,
            prepared.dataset.records,
            run_dir,
            control,
            resume,
            checkpoint_root,
            needs=needs,
            resolved_config=asdict(job),
            eval_sets=prepared.eval_sets,
        )
        training.launch_time = origin
        return training.run()
    except ResumeRefused as exc:  # a config change the checkpoint cannot honour
        raise _Exit(2, f"error: {exc}") from exc
    except CheckpointRejected as exc:  # not one checkpoint verifies and fits
        raise _Exit(
            2,
            f"error: {exc}",
            f"every checkpoint is listed with its reason by: hybridflow-coordinator verify "
            f"{run_dir}",
        ) from exc
    except (RuntimeError, ValueError) as exc:  # ServiceError is a RuntimeError
        log.debug("job failed", exc_info=True)
        print(f"job failed: {_one_line(exc)}", file=sys.stderr)
        write_report_logged(run_dir, log)  # the steps done so far, for the post-mortem
        lines = [f"resume with: deploy/launch.sh --resume {run_dir}"] if checkpoint_root else []
        raise _Exit(1, *lines) from exc


def _report(summary: RunSummary, run_dir: Path) -> None:
    """The run's plots, then its outcome in a few lines."""
    from hybridflow.coordinator.report import write_report_logged

    write_report_logged(run_dir, log)
    print(
        f"reward: start {summary.reward_start:.3f} -> end {summary.reward_end:.3f} "
        f"(mean of last {min(20, summary.num_steps)} steps) over {summary.num_steps} steps "
        f"in {summary.wall_s:.0f}s, {summary.samples_per_s:.1f} samples/s",
        file=sys.stderr,
    )
    if summary.mfu is not None:
        print(f"learner MFU: {100 * summary.mfu:.1f}%", file=sys.stderr)
    for line in _eval_lines(run_dir):
        print(line, file=sys.stderr)
    if summary.checkpoint:
        print(f"checkpoint: {summary.checkpoint}", file=sys.stderr)
    print(f"results: {run_dir}", file=sys.stderr)


def _eval_lines(run_dir: Path) -> list[str]:
    """Each held-out set's headline, first and last evaluation of the run (eval.jsonl)."""
    from hybridflow.coordinator.evaluation import RECORDS, read_records

    by_name: dict[str, list[Any]] = {}
    for result in read_records(run_dir / RECORDS):
        by_name.setdefault(result.name, []).append(result)
    lines = []
    for name, results in by_name.items():
        first, last = results[0], results[-1]
        keys = [k for k in first.metrics if k.rsplit("/", 1)[-1].startswith(("pass@", "mean@"))]
        parts = [
            f"{k.rsplit('/', 1)[-1]} {first.metrics[k]:.3f} -> {last.metrics.get(k, float('nan')):.3f}"
            for k in sorted(keys)
        ]
        lines.append(
            f"held-out {name} (step {first.step} -> {last.step}, "
            f"{int(last.metrics.get(f'eval/{name}/num_prompts', 0))} prompts): " + ", ".join(parts)
        )
    return lines


def _report_missing_addresses(cfg: CoordinatorConfig) -> bool:
    """Prints which service addresses are not set; True when any is missing."""
    missing = [
        n
        for n, v in (
            ("coordinator.reward_address", cfg.reward_address),
            ("coordinator.learner_address", cfg.learner_address),
        )
        if not v
    ]
    if not cfg.rollout_addresses:
        missing.insert(0, "coordinator.rollout_addresses")
    if missing:
        print(
            f"config error: {', '.join(missing)} not set (deploy/launch.sh sets them)",
            file=sys.stderr,
        )
    return bool(missing)


def _one_line(exc: BaseException) -> str:
    """A failure as one line, not a traceback: a failed service call names the service, its
    status and details (the message of ``hybridflow.errors`` classes from the clients)."""
    from hybridflow.errors import ServiceError

    cause = exc.__cause__ if isinstance(exc.__cause__, (ServiceError, ValueError)) else exc
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


def load_dataset(cfg: CoordinatorConfig, model_dir: Path, tokenizer: Any) -> PromptDataset:
    """The job's prompts, tokenised, those over the prompt limit dropped (and counted); the
    limit is ``coordinator.max_prompt_tokens`` bounded by the model's positions less the
    response (``hybridflow.data.prompt_limits``). ValueError when no prompt is left."""
    from hybridflow.data.datasets import is_generated, read_prompt_dataset
    from hybridflow.data.prompt_limits import empty_after_limit, model_positions, prompt_limit

    limit = prompt_limit(
        cfg.max_prompt_tokens, cfg.sampling.max_new_tokens, model_positions(model_dir)
    )
    dataset = read_prompt_dataset(
        cfg.data,
        tokenizer,
        cfg.data_size if is_generated(cfg.data) else None,
        cfg.seed,
        limit.tokens,
        cfg.max_prompt_bytes,
    )
    if not dataset.records and dataset.num_dropped_too_long:
        raise ValueError(
            empty_after_limit(
                cfg.data, dataset.num_dropped_too_long, dataset.shortest_dropped, limit
            )
        )
    log.info(
        "dataset %s: %d prompts (%d dropped as longer than %d tokens: %s)",
        cfg.data,
        len(dataset.records),
        dataset.num_dropped_too_long,
        limit.tokens,
        limit.reason,
    )
    return dataset


def load_eval_sets(cfg: CoordinatorConfig, model_dir: Path, tokenizer: Any) -> list[EvalSet]:
    """The held-out sets of ``coordinator.eval``, tokenised as the training prompts are (the
    same prompt limit; a set left empty by it is a ValueError naming the set)."""
    from hybridflow.coordinator.evaluation import EvalSet
    from hybridflow.data.datasets import is_generated, read_prompt_dataset
    from hybridflow.data.prompt_limits import model_positions, prompt_limit

    if not cfg.eval.enabled:
        return []
    max_new_tokens = cfg.eval.sampling.max_new_tokens or cfg.sampling.max_new_tokens
    limit = prompt_limit(cfg.max_prompt_tokens, max_new_tokens, model_positions(model_dir))
    out = []
    for eval_set in cfg.eval.sets:
        generated = is_generated(eval_set.data)
        num = eval_set.size or (DEFAULT_EVAL_BUILTIN_SIZE if generated else None)
        dataset = read_prompt_dataset(
            eval_set.data, tokenizer, num, cfg.seed, limit.tokens, cfg.max_prompt_bytes
        )
        if not dataset.records:
            raise ValueError(
                f"coordinator.eval set {eval_set.name!r} ({eval_set.data}): no prompt left "
                f"({dataset.num_dropped_too_long} longer than {limit.tokens} tokens)"
            )
        log.info(
            "eval set %s: %d prompts from %s", eval_set.name, len(dataset.records), eval_set.data
        )
        out.append(EvalSet(eval_set.name, list(dataset.records)))
    return out


DEFAULT_EVAL_BUILTIN_SIZE = 64
"""Prompts of a builtin eval set whose ``size`` is 0 (builtin:arith:test has fewer: all)."""
