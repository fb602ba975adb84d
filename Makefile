# hybridflow — one entry point for humans and CI (.ci/run calls `make test`).
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SUITE ?= throughput

.PHONY: setup proto lint test test-slow run bench bench-overhead clean

setup: $(STAMP)

# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): requirements/cpu.txt pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet torch==2.13.0
	$(VPY) -m pip install --quiet -r requirements/cpu.txt
	$(VPY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

proto: setup
	$(VPY) scripts/gen_protos.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy hybridflow

test: setup
	$(VPY) -m pytest -q -m "not slow and not gpu"

test-slow: setup
	$(VPY) -m pytest -q -m slow

run: setup
	deploy/launch.sh --config deploy/configs/quickstart.yaml

# make bench SUITE=throughput|scalability|algorithm|integration  -> results/YYYYMMDD_HHMMSS/
bench: setup
	$(VPY) benchmarks/$(SUITE)/run_benchmark.py --config benchmarks/$(SUITE)/config.yaml

bench-overhead: setup
	$(VPY) benchmarks/overhead/run_overhead.py

clean:
	rm -rf $(VENV) runs results .mypy_cache .ruff_cache
