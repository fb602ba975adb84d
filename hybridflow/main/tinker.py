"""The Tinker-compatible service as a job's process: ``python -m hybridflow.main.tinker
--config job.yaml --run-dir RUN`` (what ``deploy/launch.sh`` runs for a job with
``tinker.enabled``): the job's ``model`` is the base, ``tinker:`` the service's settings, the
run's token its key (``tml-<token>``), ``RUN/tinker`` its state unless ``tinker.state_dir``
says otherwise, ``RUN/tinker.addr`` its address once it serves, and ``RUN/config.yaml`` the
resolved job (a relaunch with ``--resume RUN`` starts it again on the same state)."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.main.tinker", description=__doc__)
    parser.add_argument("--config", help="job YAML with a tinker: section")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE overrides")
    parser.add_argument("--run-dir", required=True, help="where its state and address go")
    args = parser.parse_args(argv)

    from hybridflow.deploy.lifeline import watch_parent
    from hybridflow.job_config import load_job_config

    job = load_job_config(args.config, args.set)
    watch_parent()  # it dies with the launcher
    from pathlib import Path

    from hybridflow.config.loader import dump_yaml

    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(job, run_dir / "config.yaml")  # what `deploy/launch.sh --resume` reads back
    from hybridflow.services.tinker.server import main as serve

    server_args = job.tinker.server_args(job.model, args.run_dir)
    return serve([*server_args, "--address-file", f"{args.run_dir}/tinker.addr"])


if __name__ == "__main__":
    import sys

    sys.exit(main())
