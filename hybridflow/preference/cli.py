"""The offline preference / SFT job: what ``deploy/launch.sh`` runs when ``preference.data`` is
set (one process, or every rank under torchrun for FSDP2 over ``learner.topology.nproc_per_node``).

Reads the job config (the ``model``, ``learner`` and ``preference`` sections; the rollout,
reward and coordinator sections are not used), trains ``preference.steps`` steps and writes,
in the run directory (rank 0): ``config.yaml`` (resolved), ``metrics.jsonl`` (one line per
train step and per eval), ``summary.json`` (first and last eval, last train metrics) and the
trained actor as a Hugging Face checkpoint under ``<learner.checkpoint_dir>/final``. No resume:
a stopped job starts again from the model. Bad settings or data exit 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.preference", description=__doc__)
    parser.add_argument("--config", help="job YAML with a preference: section")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override"
    )
    parser.add_argument("--run-dir", required=True, help="where metrics and checkpoints go")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from hybridflow.main.bootstrap import setup_logging, setup_torch_process, watch_parent

    watch_parent()  # under deploy/launch.sh: end when the launcher does
    from hybridflow.config.loader import ConfigError
    from hybridflow.job_config import load_job_config

    try:
        job = load_job_config(args.config, args.set)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pref = job.preference
    if not pref.data:
        print("error: preference.data is empty: nothing to train", file=sys.stderr)
        return 2
    setup_torch_process(job.learner.topology.num_threads)
    from hybridflow.config.loader import dump_yaml
    from hybridflow.preference.offline import train_offline
    from hybridflow.services.learner.distributed import init_from_env

    dist_info = init_from_env(job.learner.topology.device)
    log = setup_logging(f"preference{dist_info.rank}")
    run_dir = Path(args.run_dir)
    leader = dist_info.rank == 0
    if leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_yaml(job, run_dir / "config.yaml")
    checkpoints = Path(job.learner.checkpoint_dir or run_dir / "checkpoints")
    metrics_file = (run_dir / "metrics.jsonl").open("a") if leader else None

    def on_metrics(kind: str, metrics: dict[str, float]) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps({"kind": kind, **metrics}) + "\n")
            metrics_file.flush()
        if kind == "eval":
            log.info("eval at step %d: %s", metrics["step"], _brief(metrics))

    try:
        result = train_offline(
            job.model,
            pref.data,
            loss=pref.loss,
            steps=pref.steps,
            eval_every=pref.eval_every,
            save_to=checkpoints / "final",
            on_metrics=on_metrics,
            batch_size=pref.batch_size,
            beta=pref.beta,
            label_smoothing=pref.label_smoothing,
            dpo_loss_type=pref.dpo_loss_type,
            orpo_lambda=pref.orpo_lambda,
            orpo_nll_prompt=pref.orpo_nll_prompt,
            desirable_weight=pref.desirable_weight,
            undesirable_weight=pref.undesirable_weight,
            eval_data=pref.eval_data or None,
            num_rows=pref.num_rows,
            seed=job.learner.seed,
            learner=job.learner,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if metrics_file is not None:
            metrics_file.close()
    if leader:
        summary: dict[str, Any] = {
            "loss": pref.loss,
            "steps": pref.steps,
            "checkpoint": result.checkpoint,
            "first_eval": result.evals[0] if result.evals else None,
            "last_eval": result.evals[-1] if result.evals else None,
            "last_train": result.history[-1] if result.history else None,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info("done: %d steps, actor saved to %s", pref.steps, result.checkpoint)
    return 0


def _brief(metrics: dict[str, float]) -> str:
    keys = (
        "eval/rewards/accuracies",
        "eval/mean_logps/accuracies",
        "eval/rewards/margins",
        "eval/nll",
    )
    return ", ".join(f"{k.removeprefix('eval/')}={metrics[k]:.4f}" for k in keys if k in metrics)
