#!/usr/bin/env bash
# GPU readiness check for a CUDA machine with the `vllm` package (run from the repo root):
#   1. the gpu-marked tests: vLLM on CUDA, log-prob parity before/after NCCL and gRPC syncs;
#   2. the vLLM-vs-HF engine benchmark on the GPU;
#   3. a short learning run of the quickstart with vLLM generating and FSDP2 training on CUDA.
# Prints the figures; exits non-zero on the first failure. Time: a few minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import torch, vllm; assert torch.cuda.is_available(), "no CUDA device"; print("torch", torch.__version__, "vllm", vllm.__version__, torch.cuda.get_device_name(0))'
echo "== 1/3 gpu tests"
"$PY" -m pytest -q -s -m gpu tests/gpu
echo "== 2/3 engines benchmark (cuda)"
"$PY" benchmarks/engines/run_engines.py --models tiny,100m --repeats 2 --device cuda
echo "== 3/3 quickstart with vLLM on CUDA (100 steps)"
run_dir=$(mktemp -d)/run
PYTHON="$PY" deploy/launch.sh --config deploy/configs/quickstart.yaml --run-dir "$run_dir" \
    --set rollout.engine=vllm --set rollout.device=cuda --set learner.topology.device=cuda \
    --set coordinator.num_steps=100 --set coordinator.progress=false
"$PY" -c "import json,sys; s=json.load(open('$run_dir/summary.json')); print('reward', s['reward_start'], '->', s['reward_end'])"
