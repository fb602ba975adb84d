"""The one-process branch of ``deploy/launch.sh``: a job whose plan is one process of its own
(``job.plan.ONE_PROCESS_JOBS``): the learner-only preference job (``python -m
hybridflow.preference``, under torchrun when ``learner.topology.nproc_per_node`` > 1) or the
Tinker-compatible service (``python -m hybridflow.main.tinker``). Runs it in the run directory
and waits for it.

No rollout, reward service or coordinator starts. SIGTERM / Ctrl-C is forwarded to the job's
process group once; a second one kills it. The job dies with the launcher (lifeline env).
This module knows nothing about the training itself.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("launch")


def main_command(job: Any, config_path: str, overrides: list[str], run_dir: Path) -> list[str]:
    """The job's command line: its plan's only process (torchrun for several learner ranks,
    as for the learner service)."""
    from hybridflow.job.plan import config_args, plan, python_command

    cmd = python_command(sys.executable, plan(job).main, job.learner)
    return [*cmd, "--run-dir", str(run_dir), *config_args(config_path, overrides)]


def run_one_process_job(
    job: Any, config_path: str, overrides: list[str], run_dir: Path, env: dict[str, str]
) -> int:
    """Runs the offline job to the end; its exit code (130 when stopped by a signal)."""
    from hybridflow.deploy.lifeline import launcher_env

    child_env = {**os.environ, **env, **launcher_env()}
    from hybridflow.job.plan import plan

    devices = plan(job).main.devices
    if devices:
        child_env["CUDA_VISIBLE_DEVICES"] = devices
    cmd = main_command(job, config_path, overrides, run_dir)
    what = (
        "the Tinker-compatible service" if job.tinker.enabled else f"the {job.preference.loss} job"
    )
    log.info("%s alone (no rollout or reward service); run dir %s", what, run_dir)
    proc = subprocess.Popen(cmd, env=child_env, start_new_session=True)
    stops = [0]

    def on_signal(signum: int, _frame: object) -> None:
        stops[0] += 1
        try:
            os.killpg(proc.pid, signal.SIGTERM if stops[0] == 1 else signal.SIGKILL)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = proc.wait()
    if stops[0]:
        return 130
    if code != 0:
        print(f"{what} exited with {code} (see above)", file=sys.stderr)
    return code
