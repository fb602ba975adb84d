"""``hybridflow-coordinator eval``: evaluates a run's checkpoint, or any Hugging Face
checkpoint, offline, through the services a launch starts.

    hybridflow-coordinator eval RUN_DIR [--step N] [--set KEY=VALUE ...] [--out DIR]
    hybridflow-coordinator eval --model DIR [--config job.yaml] [--set KEY=VALUE ...] [--out DIR]

With RUN_DIR the job is the run's (its first launch's config and overrides, ``launch.json``)
and the policy its checkpoint of step N (the newest by default): the Hugging Face export
(``checkpoints/hf/step_N``: a run exports its last step) when the step has one, which the
replicas load; else the step's resumable train state (``coordinator.checkpoint_every``),
which the job's learner loads and publishes to the replicas as a training job would. With
``--model`` the job is ``--config``'s (default the quickstart) and the policy the model given
(a directory or a builtin name). Either way the evaluation is the job's ``coordinator.eval``
(its sets, k, sampling and seed; ``--set`` changes any of them), so evaluating a run's step
repeats the run's own evaluation of it.

The job's rollout replicas, reward service and environment service (and the learner, for a
train state) are started as the launcher starts them (``job.plan.eval_plan``), with a token
of their own, in the output directory (default ``RUN_DIR/eval/step_N``, or
``runs/eval_<time>`` for ``--model``), evaluated once and stopped. Results:
``OUT/results.json`` and ``OUT/samples.jsonl`` (``coordinator/offline_eval.py``); for a run,
also a line per set in ``RUN_DIR/eval_offline.jsonl`` and the run's report redrawn (its
eval plot marks them). Exit 0: evaluated; 1: a service failed or the evaluation timed out;
2: bad input (nothing started).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridflow.coordinator.offline_eval import OfflineResult
    from hybridflow.job_config import JobConfig

log = logging.getLogger("eval")
DEFAULT_CONFIG = "deploy/configs/quickstart.yaml"


class _Refused(Exception):
    """Bad input: one line, exit 2, before any process starts."""


@dataclass
class _Target:
    """What is evaluated, under which job, into which directory."""

    config_path: str
    overrides: list[str]
    model: str
    step: int
    policy_version: int
    out_dir: Path
    run_dir: Path | None
    train_state: str = ""
    """The learner name of the run's train state to evaluate ("": the model is a Hugging
    Face checkpoint the replicas load)."""
    checkpoint_root: Path | None = None

    @property
    def label(self) -> str:
        """What the results say was evaluated: the model, or the train state's path."""
        if self.train_state and self.checkpoint_root is not None:
            return str(self.checkpoint_root / self.train_state)
        return self.model


def eval_command(args: Any) -> int:
    """Runs ``hybridflow-coordinator eval`` (module docstring); the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s eval %(levelname)s: %(message)s")
    try:
        target = _target(args)
        job = _job(target)
    except _Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result, decode = _evaluate(target, job)
    except (RuntimeError, TimeoutError, ValueError) as exc:  # a service's start or a call
        print(f"eval failed: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return _report(result, target, decode)


def _target(args: Any) -> _Target:
    if bool(args.run_dir) == bool(args.model):
        raise _Refused("give a run directory or --model DIR (one of them)")
    overrides = list(args.set)
    if args.model:
        if args.step is not None:
            raise _Refused("--step is for a run directory's checkpoints; --model names one model")
        out = Path(args.out) if args.out else None
        return _Target(
            args.config or DEFAULT_CONFIG,
            overrides,
            args.model,
            0,
            0,
            out or Path("runs") / time.strftime("eval_%Y%m%d_%H%M%S"),
            None,
        )
    if args.config:
        raise _Refused("--config is for --model; a run is evaluated under its own job")
    run_dir = Path(args.run_dir)
    record = run_dir / "launch.json"
    if not record.is_file():
        raise _Refused(f"{run_dir} is not a launched run directory (no launch.json)")
    launch = json.loads(record.read_text())
    config_path, run_overrides = launch["config"], list(launch["overrides"])
    root, base_model = _checkpoint_root(run_dir, config_path, run_overrides)
    step, export, train_state, version = _checkpoint(root, args.step)
    out = Path(args.out) if args.out else run_dir / "eval" / f"step_{step}"
    if export is None:  # the learner loads the train state and publishes it to the replicas
        overrides = [*overrides, f"learner.checkpoint_dir={root.resolve()}"]
    return _Target(
        config_path,
        [*run_overrides, *overrides],
        str(export) if export is not None else base_model,
        step,
        version,
        out,
        run_dir,
        train_state,
        root,
    )


def _checkpoint_root(run_dir: Path, config_path: str, overrides: list[str]) -> tuple[Path, str]:
    """The run's checkpoint directory and its model (the policy a train state starts from)."""
    from hybridflow.config.loader import ConfigError
    from hybridflow.job_config import load_job_config

    try:
        job = load_job_config(config_path, overrides)
    except ConfigError as exc:
        raise _Refused(f"the run's config no longer loads: {exc}") from exc
    root = (
        Path(job.learner.checkpoint_dir) if job.learner.checkpoint_dir else run_dir / "checkpoints"
    )
    return root, job.model


def _checkpoint(root: Path, step: int | None) -> tuple[int, Path | None, str, int]:
    """What of the run's checkpoints to evaluate: its step, its Hugging Face export (None:
    the learner loads the step's resumable train state instead), that state's learner
    name and the policy version (-1: unknown, an export without its train state). Default:
    the newest step with either."""
    from hybridflow.coordinator.checkpoint import CheckpointStore

    store = CheckpointStore(root)
    exports = {
        int(p.name.removeprefix("step_")): p
        for p in sorted((root / "hf").glob("step_*"))
        if p.name.removeprefix("step_").isdigit() and (p / "config.json").is_file()
    }
    states = set(store.complete_steps())
    if not exports and not states:
        raise _Refused(
            f"no checkpoint under {root}: neither a Hugging Face export (hf/step_N, the "
            "run's last step) nor a resumable train state (coordinator.checkpoint_every)"
        )
    chosen = max(exports.keys() | states) if step is None else step
    if chosen not in exports and chosen not in states:
        raise _Refused(
            f"step {chosen} has no checkpoint under {root} (exported: "
            f"{', '.join(map(str, sorted(exports))) or 'none'}; train states: "
            f"{', '.join(map(str, sorted(states))) or 'none'})"
        )
    version = -1
    if chosen in states:
        problem = store.check(chosen)
        if problem is not None and chosen not in exports:
            raise _Refused(f"the checkpoint of step {chosen} does not verify: {problem}")
        if problem is None:
            version = store.read_state(chosen).policy_version
    if chosen in exports:
        return chosen, exports[chosen], "", version
    return chosen, None, store.learner_name(chosen), version


def _job(target: _Target) -> JobConfig:
    """The job with the evaluated model; refused when it has no eval set or its preflight
    (ports, model, data, eval sets) fails."""
    from hybridflow.config.loader import ConfigError
    from hybridflow.deploy.preflight import check_job
    from hybridflow.job_config import load_job_config

    target.overrides.append(f"model={target.model}")
    try:
        job = load_job_config(target.config_path, target.overrides)
    except ConfigError as exc:
        raise _Refused(f"config error: {exc}") from exc
    if not job.coordinator.eval.enabled:
        raise _Refused(
            "the job's coordinator.eval lists no set; name one, e.g. --set "
            "'coordinator.eval.sets=[{name: arith-test, data: \"builtin:arith:test\"}]'"
        )
    problems = check_job(job)
    if problems:
        raise _Refused("; ".join(problems))
    return job


def _evaluate(target: _Target, job: JobConfig) -> tuple[OfflineResult, Any]:
    """Starts the eval plan's services in the output directory, evaluates, stops them."""
    from hybridflow.coordinator.episode_sources import episode_runner
    from hybridflow.coordinator.offline_eval import evaluate_once
    from hybridflow.deploy.launcher import ServiceGroup
    from hybridflow.deploy.lifeline import launcher_env
    from hybridflow.deploy.run_dir_mode import prepare_run_dir, run_umask
    from hybridflow.deploy.run_lock import lock_run_dir
    from hybridflow.job.plan import eval_plan
    from hybridflow.main.coordinator_run import load_eval_sets
    from hybridflow.models import resolve_model_path
    from hybridflow.models.text_only import load_tokenizer
    from hybridflow.rpc.token import export_run_token

    cfg = job.coordinator
    os.umask(run_umask(job.deploy.group_readable))
    prepare_run_dir(target.out_dir, job.deploy.group_readable)
    lock = lock_run_dir(target.out_dir)  # one evaluation per output directory
    export_run_token(target.out_dir, os.environ)  # the services' and these clients' token
    model_dir = resolve_model_path(job.model)
    tokenizer = load_tokenizer(model_dir)
    sets = load_eval_sets(cfg, model_dir, tokenizer)
    group = ServiceGroup(
        job,
        target.config_path,
        target.overrides,
        target.out_dir,
        env=launcher_env(),
        job_plan=eval_plan(job, learner=bool(target.train_state)),
    )
    with group:
        group.start()
        addresses = group.wait_ready(job.deploy.health_timeout_s)
        clients, close = _clients(job, addresses, tokenizer)
        try:
            if target.train_state:
                target.policy_version = _load_train_state(job, addresses, target)
            episodes = episode_runner(cfg.multi_turn, clients, greedy_baseline=False)
            result = evaluate_once(
                cfg.eval,
                sets,
                clients,
                max_new_tokens=cfg.sampling.max_new_tokens,
                seed=cfg.seed,
                out_dir=target.out_dir,
                model=target.label,
                step=target.step,
                policy_version=target.policy_version,
                episodes=episodes,
            )
        finally:
            close()
    del lock  # held to here
    return result, clients.decode


def _load_train_state(job: JobConfig, addresses: dict[str, str], target: _Target) -> int:
    """Has the learner load the run's train state and publish it to the replicas; the
    policy version they then serve (the checkpoint's, checked)."""
    from hybridflow.services.learner.client import GrpcLearnerClient

    learner = GrpcLearnerClient(addresses["learner"], job.coordinator.channel)
    try:
        version = learner.load_train_state(target.train_state)
        if version != target.policy_version:
            raise RuntimeError(
                f"the learner restored version {version} from {target.train_state}, its "
                f"checkpoint says {target.policy_version}"
            )
        targets = [a for n, a in addresses.items() if n.startswith("rollout")]
        report = learner.publish_weights(targets)
    finally:
        learner.close()
    log.info(
        "train state %s (policy v%d) published to %d replica(s): %.1f MB in %.2fs",
        target.train_state,
        version,
        len(targets),
        report.num_bytes / 1e6,
        report.duration_s,
    )
    return version


def _clients(job: JobConfig, addresses: dict[str, str], tokenizer: Any) -> tuple[Any, Any]:
    """The replicas', reward's (and environment's) clients, and how to close them."""
    from hybridflow.coordinator.offline_eval import EvalClients
    from hybridflow.services.reward.client import GrpcRewardClient
    from hybridflow.services.rollout.client import GrpcRolloutClient

    channel = job.coordinator.channel
    replicas = [a for n, a in addresses.items() if n.startswith("rollout")]
    rollouts = [GrpcRolloutClient(a, channel) for a in replicas]
    reward = GrpcRewardClient(addresses["reward"], channel)
    environments = None
    if job.coordinator.multi_turn.enabled:
        from hybridflow.services.environment.factory import make_environment_client

        environments = make_environment_client(
            addresses.get("environment", ""),
            channel,
            agent_timeout_s=job.environment.agent_timeout_s,
        )
    clients = EvalClients(
        rollouts,
        reward,
        lambda ids: str(tokenizer.decode(ids.tolist(), skip_special_tokens=True)),
        environments=environments,
        tokenizer=tokenizer,
        weight_targets=replicas,
    )

    def close() -> None:
        for rollout in rollouts:
            rollout.close()
        reward.close()
        shutdown = getattr(environments, "shutdown", None)
        if shutdown is not None:
            shutdown()

    return clients, close


def _report(result: OfflineResult, target: _Target, decode: Any) -> int:
    """Writes the results (and, for a run, its report); prints each set's headline."""
    from hybridflow.coordinator.offline_eval import summary_lines, write_results
    from hybridflow.coordinator.report import write_report_logged

    path = write_results(result, target.out_dir, decode, target.run_dir)
    if target.run_dir is not None:
        write_report_logged(target.run_dir, log)
    for line in summary_lines(result):
        print(line, file=sys.stderr)
    print(f"results: {path}", file=sys.stderr)
    return 0 if result.complete else 1
