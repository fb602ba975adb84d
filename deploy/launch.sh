#!/usr/bin/env bash
# Launches a hybridflow job: reward, learner (torchrun when learner.topology.nproc_per_node > 1) and
# rollout services (and the environment service when environment.envs lists a class) as their
# own processes, waits for their health checks, runs the coordinator and supervises them all
# (a dead rollout / reward / environment service is restarted; a dead learner or coordinator
# stops the job with the command to resume). SIGTERM or Ctrl-C stops
# every process it started within deploy.stop_timeout_s plus the services' grace; a second
# one kills at once. Its processes also end when it is killed.
#
#   deploy/launch.sh [--config deploy/configs/quickstart.yaml] [--set key=value ...] [--run-dir DIR]
#   deploy/launch.sh --resume RUN_DIR|auto [--set key=value ...]
#
# Uses $PYTHON, else .venv/bin/python (created by `make setup`), else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
# exec: this pid is the launcher, so a signal (or SIGKILL) sent to it reaches the process
# that supervises the job, not a shell in between.
exec "$PY" -m hybridflow.deploy.launch "$@"
