"""``python -m hybridflow.deploy.launch``: what deploy/launch.sh runs.

Starts every service, waits for health, runs the coordinator in the foreground, and stops
every process it started when the coordinator ends, fails, or on Ctrl-C / SIGTERM.
Ctrl-C reaches the coordinator directly (same terminal): it finishes its step, saves, exits.
SIGTERM to the launcher is forwarded to the coordinator with the same effect.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deploy/launch.sh", description=__doc__)
    parser.add_argument("--config", default="deploy/configs/quickstart.yaml", help="job YAML")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override for every process (repeatable)",
    )
    parser.add_argument("--run-dir", help="output directory (default: runs/<timestamp>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launch %(levelname)s: %(message)s")
    log = logging.getLogger("launch")

    from hybridflow.config.job import load_job_config
    from hybridflow.config.loader import ConfigError
    from hybridflow.deploy.preflight import check_job, config_problems, report

    try:
        job = load_job_config(args.config, args.set)
    except ConfigError:
        return report(config_problems(args.config, args.set))  # every problem, exit 2
    if report(check_job(job)):  # ports, model, TLS files, data: before any service starts
        return 2
    run_dir = Path(args.run_dir or Path(job.deploy.run_root) / time.strftime("%Y%m%d_%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)

    from hybridflow.deploy.launcher import ServiceGroup
    from hybridflow.models import resolve_model_path

    coordinator: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, _frame: object) -> None:
        if not coordinator:
            raise KeyboardInterrupt  # still starting: abort; the with-block stops services
        if signum == signal.SIGTERM:
            coordinator[0].send_signal(signal.SIGTERM)  # it stops after its current step
        # SIGINT: the coordinator shares our terminal and got the same Ctrl-C.

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        log.info("model %s -> %s", job.model, resolve_model_path(job.model))  # builds builtin once
        with ServiceGroup(job, args.config, list(args.set), run_dir) as group:
            group.start()
            log.info("waiting for %d services (logs in %s/logs)", len(group.processes), run_dir)
            try:
                addresses = group.wait_ready(job.deploy.health_timeout_s)
            except (RuntimeError, TimeoutError) as exc:
                log.error("%s", exc)
                return 1
            log.info("services ready: %s", ", ".join(f"{k}={v}" for k, v in addresses.items()))
            cmd = [
                sys.executable,
                "-m",
                "hybridflow.coordinator",
                "run",
                "--config",
                args.config,
                "--run-dir",
                str(run_dir),
            ]
            for override in [*args.set, *group.address_overrides()]:
                cmd += ["--set", override]
            coordinator.append(subprocess.Popen(cmd))
            code = coordinator[0].wait()
            usage = group.resource_usage()
            (run_dir / "service_usage.json").write_text(json.dumps(usage, indent=2) + "\n")
            log.info("coordinator exited with %d; stopping services", code)
    except KeyboardInterrupt:
        log.warning("interrupted before the coordinator started; services stopped")
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
