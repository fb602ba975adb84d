#!/usr/bin/env bash
# Launches a hybridflow job: reward, learner (torchrun when learner.nproc_per_node > 1) and
# rollout services as their own processes, waits for their health checks, runs the
# coordinator, and stops every process it started on exit, Ctrl-C or SIGTERM.
#
#   deploy/launch.sh [--config deploy/configs/quickstart.yaml] [--set key=value ...] [--run-dir DIR]
#
# Uses $PYTHON, else .venv/bin/python (created by `make setup`), else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi

launcher_pid=""
cleanup() {
  # Only the launcher we started; it stops the services it started (each in its own group).
  if [[ -n "$launcher_pid" ]] && kill -0 "$launcher_pid" 2>/dev/null; then
    kill -TERM "$launcher_pid" 2>/dev/null || true
    while kill -0 "$launcher_pid" 2>/dev/null; do wait "$launcher_pid" 2>/dev/null || true; done
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM
# Ctrl-C reaches the launcher and coordinator directly; this shell just waits for them.
trap '' INT

"$PY" -m hybridflow.deploy.launch "$@" &
launcher_pid=$!
set +e
wait "$launcher_pid"
code=$?
while kill -0 "$launcher_pid" 2>/dev/null; do wait "$launcher_pid"; code=$?; done
launcher_pid=""
exit "$code"
