"""``hybridflow-coordinator``: run a job against running services, or steer a running job.

    hybridflow-coordinator run --config job.yaml [--set k=v ...] [--run-dir DIR]
    hybridflow-coordinator status|pause|resume|stop [--address HOST:PORT | --run-dir DIR]
    hybridflow-coordinator scale [--add HOST:PORT ...] [--remove HOST:PORT ...] [--wait S] ...
    hybridflow-coordinator report RUN_DIR
    hybridflow-coordinator verify RUN_DIR
    hybridflow-coordinator eval RUN_DIR [--step N] | --model DIR [--config job.yaml]


``run`` writes DIR/coordinator.addr so the other commands can find the job by its run dir.
``scale`` adds running rollout replicas to the job (each serves once its catch-up weight sync
passed its check) or drains some (each ends its request in flight, then leaves); ``--wait``
waits until they have (docs/scaling.md).
``report`` (re)draws the run's plots into RUN_DIR/report/, also while the run is going.
``verify`` checks every checkpoint of RUN_DIR against its manifest (no services needed).
``eval`` evaluates a run's exported checkpoint, or any model, on the job's held-out sets
(``coordinator.eval``) through the services it starts (``hybridflow/main/coordinator_eval.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hybridflow.utils.config_args import add_config_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridflow-coordinator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a training job against running services")
    add_config_args(run, "job YAML", "coordinator.num_steps=10")
    run.add_argument("--run-dir", help="output directory (default: <deploy.run_root>/<timestamp>)")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir from its newest complete checkpoint",
    )
    run.add_argument(
        "--addresses-from-stdin",
        action="store_true",
        help="prepare (tokenizer, dataset), then read the services' addresses as one JSON "
        "list of KEY=VALUE overrides from stdin (deploy/launch.sh starts the coordinator "
        "alongside the services this way)",
    )
    for name, text in (
        ("status", "show the job's state and last metrics"),
        ("pause", "pause after the current step"),
        ("resume", "resume a paused job"),
        ("stop", "stop after the current step (checkpoint is saved)"),
    ):
        p = sub.add_parser(name, help=text)
        _add_control_args(p)
    scale = sub.add_parser(
        "scale", help="add rollout replicas to the running job, or drain and remove some"
    )
    _add_control_args(scale)
    scale.add_argument(
        "--add", action="append", default=[], metavar="HOST:PORT", help="a running replica to add"
    )
    scale.add_argument(
        "--remove", action="append", default=[], metavar="HOST:PORT", help="a replica to drain"
    )
    scale.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds until each added replica serves and each removed one is "
        "gone (exit 1 if not)",
    )
    report = sub.add_parser(
        "report", help="draw RUN_DIR/metrics.jsonl as PNG plots in RUN_DIR/report/"
    )
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (also one in progress)")
    verify = sub.add_parser(
        "verify",
        help="check every checkpoint of RUN_DIR against its manifest: one line each; exit 1 "
        "when the newest is refused (docs/checkpoints.md)",
    )
    verify.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    verify.add_argument(
        "--checkpoints",
        metavar="DIR",
        help="the checkpoint directory (default: RUN_DIR/checkpoints)",
    )
    evaluate = sub.add_parser(
        "eval",
        help="evaluate a run's exported checkpoint (or --model DIR) on the job's held-out sets "
        "(coordinator.eval) through the rollout, reward and environment services it starts",
    )
    evaluate.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="a launched run")
    evaluate.add_argument(
        "--step", type=int, help="the exported step to evaluate (default: the newest)"
    )
    evaluate.add_argument("--model", help="evaluate this model (a directory or builtin name)")
    add_config_args(
        evaluate, "job YAML (with --model; default the quickstart)", "coordinator.eval.k=4"
    )
    evaluate.add_argument(
        "--out", help="output directory (default RUN_DIR/eval/step_N, or runs/eval_<time>)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    started_at = time.time()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        from hybridflow.main.coordinator_run import run_job

        if args.resume and not args.run_dir:
            parser.error("--resume needs --run-dir")
        return run_job(
            args.config,
            args.set,
            args.run_dir,
            resume=args.resume,
            addresses_from_stdin=args.addresses_from_stdin,
            started_at=started_at,
        )
    if args.command == "report":
        return report_command(Path(args.run_dir))
    if args.command == "eval":
        from hybridflow.main.coordinator_eval import eval_command

        return eval_command(args)
    if args.command == "verify":
        root = Path(args.checkpoints) if args.checkpoints else Path(args.run_dir) / "checkpoints"
        return verify_command(root)
    return control_command(args)


def report_command(run_dir: Path) -> int:
    """Draws the run report; prints the files (0), or one line saying why not (2)."""
    from hybridflow.coordinator.report import write_report

    try:
        files = write_report(run_dir)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in files:
        print(path)
    return 0


def verify_command(root: Path) -> int:
    """Prints one line per checkpoint under ``root``, newest first (ok, or why it is refused);
    returns 0 when the newest verifies, 1 when it does not, 2 when there is none. Checks
    integrity only: whether a checkpoint fits a job (shapes, algorithm) is checked at resume."""
    from hybridflow.coordinator.checkpoint import CheckpointStore

    store = CheckpointStore(root)
    steps = list(reversed(store.steps()))
    if not steps:
        print(f"error: no checkpoint under {root}", file=sys.stderr)
        return 2
    newest_ok = False
    for step in steps:
        problem = store.check(step)
        if problem is None:
            state = store.read_state(step)
            print(
                f"{store.step_name(step)}  ok  (step {state.step}, policy v{state.policy_version})"
            )
        else:
            print(f"{store.step_name(step)}  REFUSED  {problem}")
        if step == steps[0]:
            newest_ok = problem is None
    return 0 if newest_ok else 1


def _add_control_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="coordinator control address host:port")
    p.add_argument("--run-dir", help="find the address in RUN_DIR/coordinator.addr")
    p.add_argument("--json", action="store_true", help="print JSON")


def _control_address(args: argparse.Namespace) -> str | None:
    """The coordinator's address (--address, or RUN_DIR/coordinator.addr, whose run's token
    is then used); None after printing why there is none."""
    if args.address:
        return str(args.address)
    if not args.run_dir:
        print("error: give --address or --run-dir", file=sys.stderr)
        return None
    addr_file = Path(args.run_dir) / "coordinator.addr"
    if not addr_file.is_file():
        print(f"error: {addr_file} not found (is the job running?)", file=sys.stderr)
        return None
    token_file = Path(args.run_dir) / "token"  # the launcher's per-run token
    if token_file.is_file():  # written only when the launcher made the run's own token
        os.environ["HYBRIDFLOW_TOKEN"] = token_file.read_text().strip()
    return addr_file.read_text().strip()


def control_command(args: argparse.Namespace) -> int:
    address = _control_address(args)
    if address is None:
        return 2

    import grpc

    from hybridflow.coordinator.client import control_call, scale_call

    try:
        if args.command == "scale":
            status = scale_call(address, args.add, args.remove, timeout_s=10)
            if args.wait > 0:
                status = _wait_for_scale(address, args, status)
        else:
            status = control_call(address, args.command, timeout_s=10)
    except grpc.RpcError as exc:
        print(
            f"error: coordinator at {address}: {exc.code().name}: {exc.details()}", file=sys.stderr
        )  # type: ignore[attr-defined]
        return 1
    if args.json:
        print(json.dumps(dataclasses.asdict(status), indent=2))
    else:
        reward = status.last_metrics.get("critic/score/mean")
        print(
            f"state {status.state}  step {status.step}/{status.total_steps}  "
            f"policy v{status.policy_version}"
            + (f"  reward {reward:.3f}" if reward is not None else "")
        )
        if status.waiting_for:
            print(f"waiting for: {status.waiting_for}")
        if status.error:
            print(f"error: {status.error}")
        for replica in status.replicas:
            print(f"replica {replica.address}  {replica.state}  v{replica.policy_version}")
        print(f"run dir: {status.run_dir}")
    if args.command == "stop":
        print(stop_hint(status.step, status.total_steps, status.run_dir), file=sys.stderr)
    if args.command == "scale" and args.wait > 0 and not _scaled(args, status):
        print(
            f"error: not scaled within {args.wait:g}s (see each replica's state)", file=sys.stderr
        )
        return 1
    return 0


def _scaled(args: argparse.Namespace, status: Any) -> bool:
    """Whether each added replica serves and each removed one is gone."""
    states = {r.address: r.state for r in status.replicas}
    return all(states.get(a) == "serving" for a in args.add) and all(
        states.get(a) in ("removed", "lost") for a in args.remove
    )


def _wait_for_scale(address: str, args: argparse.Namespace, status: Any) -> Any:
    """Polls the job's status until ``_scaled`` (or an added replica is lost, or --wait
    passes, or the job ends); the last status."""
    from hybridflow.coordinator.client import control_call

    deadline = time.monotonic() + args.wait
    while not _scaled(args, status) and time.monotonic() < deadline:
        states = {r.address: r.state for r in status.replicas}
        if any(states.get(a) == "lost" for a in args.add) or status.state in ("done", "failed"):
            break
        time.sleep(1.0)
        status = control_call(address, "status", timeout_s=10)
    return status


def stop_hint(step: int, total_steps: int, run_dir: str) -> str:
    """What ``stop`` tells the user. It exits 0: the stop was asked for and accepted, so it is
    not a failure; the run is unfinished, which this line says, with how to continue."""
    return (
        f"stopping after the current step (step {step} of {total_steps} done); it is "
        f"checkpointed on the way out. Continue with: deploy/launch.sh --resume {run_dir}"
    )


def default_run_dir(root: str) -> Path:
    return Path(root) / time.strftime("%Y%m%d_%H%M%S")


if __name__ == "__main__":
    sys.exit(main())
