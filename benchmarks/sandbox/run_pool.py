"""The sandbox pool's throughput and latency against the same programs run with a plain
subprocess (no isolation): the cost of isolation, at 1, 2 and 4 workers.

    python benchmarks/sandbox/run_pool.py            # the mix x 3 rounds per setting
    python benchmarks/sandbox/run_pool.py --rounds 1 # a smoke run

Each program is a code-scorer run (the harness and its tests, ``code_tests.py``): the mix
(``MIX``) has right and wrong functions, a syntax error, a runtime error, a computation of
about a tenth of a second, a sleep (a program waiting on nothing), a memory bomb and an
output flood, with one infinite loop stopped by its CPU limit. "plain" runs the same
harness files in a temporary directory with ``subprocess`` under the same wall time and
resource limits (set with ``setrlimit``), without namespaces, uid or mounts: the difference
is what the isolation costs. Per setting: programs/s (all of the mix submitted at once), latency p50 and
p99 (submit to verdict). Writes results/sandbox_pool_<stamp>/summary.json. Run nothing else
on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hybridflow.sandbox.code_tests import CodeTests, run_tests  # noqa: E402
from hybridflow.sandbox.config import SandboxConfig  # noqa: E402
from hybridflow.sandbox.factory import pool_from_config  # noqa: E402
from hybridflow.sandbox.types import SandboxLimits, SandboxResult  # noqa: E402

TESTS = CodeTests(asserts=tuple(f"assert f({x})=={3 * x + 1}" for x in (-3, 0, 1, 2, 5, 11)))
MIX: list[tuple[str, str, int]] = [
    ("right", "def f(x):return 3*x+1", 10),
    ("wrong", "def f(x):return 3*x+2", 4),
    ("syntax", "def f(x) return 3*x+1", 2),
    ("runtime", "def f(x):return y", 2),
    ("compute", "s=sum(i*i for i in range(10**6))\ndef f(x):return 3*x+1", 2),
    ("sleep", "import time\ntime.sleep(0.3)\ndef f(x):return 3*x+1", 2),
    ("memory", "x=bytearray(2**31)", 1),
    ("flood", "print('x'*10**7)", 1),
    ("loop", "while True: pass", 1),
]
"""(kind, program, copies): 25 programs."""
CONFIG = SandboxConfig(wall_s=10, cpu_s=1, memory_mb=512, output_kb=64)


class PlainRunner:
    """The same harness files run by ``subprocess`` in a temporary directory under the same
    limits: no namespaces, no other uid, no mounts (what isolation is measured against)."""

    def run(self, argv, files, limits: SandboxLimits, stdin: bytes = b"") -> SandboxResult:
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in files.items():
                Path(tmp, name).write_text(
                    content if isinstance(content, str) else content.decode()
                )
            start = time.monotonic()
            try:
                proc = subprocess.run(
                    ["/usr/bin/python3", *argv[1:]], cwd=tmp, input=stdin, capture_output=True,
                    timeout=limits.wall_s, preexec_fn=lambda: _limit(limits),
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                return SandboxResult("timeout", None, b"", b"", time.monotonic() - start, "wall")
            outcome = "ok" if proc.returncode == 0 else "exit"
            return SandboxResult(outcome, proc.returncode, proc.stdout, proc.stderr, 0.0)


def _limit(limits: SandboxLimits) -> None:
    for which, value in (
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
    ):
        resource.setrlimit(which, (value, value + 1 if which == resource.RLIMIT_CPU else value))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def measure(runner: Any, workers: int, rounds: int) -> dict[str, Any]:
    """The mix, ``rounds`` times, all submitted at once to ``workers`` threads."""
    programs = [(kind, code) for kind, code, copies in MIX for _ in range(copies)] * rounds
    limits = CONFIG.limits()

    def one(item: tuple[str, str]) -> tuple[str, str, float]:
        start = time.perf_counter()
        verdict = run_tests(runner, item[1], TESTS, limits)
        return item[0], verdict.outcome, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as threads:  # the pool queues beyond its own slots
        done = list(threads.map(one, programs))
    wall = time.perf_counter() - start
    latencies = [s for _, _, s in done]
    outcomes: dict[str, dict[str, int]] = {}
    for kind, outcome, _ in done:
        outcomes.setdefault(kind, {}).setdefault(outcome, 0)
        outcomes[kind][outcome] += 1
    return {
        "programs": len(done),
        "wall_s": wall,
        "programs_per_s": len(done) / wall,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "outcomes": outcomes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="times the mix runs per setting")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for workers in [int(w) for w in args.workers.split(",")]:
        pool = pool_from_config(SandboxConfig(**{**CONFIG.__dict__, "workers": workers}))
        try:
            sandboxed = measure(pool, workers, args.rounds)
        finally:
            pool.close()
        plain = measure(PlainRunner(), workers, args.rounds)
        results[str(workers)] = {
            "sandbox": sandboxed,
            "plain": plain,
            "sandbox_over_plain_throughput": sandboxed["programs_per_s"] / plain["programs_per_s"],
        }
        print(
            f"workers {workers}: sandbox {sandboxed['programs_per_s']:.1f} programs/s "
            f"(p50 {sandboxed['latency_p50_s'] * 1e3:.0f} ms, p99 {sandboxed['latency_p99_s'] * 1e3:.0f} ms); "
            f"plain {plain['programs_per_s']:.1f}/s (p50 {plain['latency_p50_s'] * 1e3:.0f} ms, "
            f"p99 {plain['latency_p99_s'] * 1e3:.0f} ms); sandbox/plain "
            f"{results[str(workers)]['sandbox_over_plain_throughput']:.2f}",
            flush=True,
        )
    out = REPO / "results" / f"sandbox_pool_{dt.datetime.now():%Y%m%d_%H%M%S}"
    out.mkdir(parents=True)
    summary = {
        "mix": [{"kind": k, "copies": c} for k, _, c in MIX],
        "config": CONFIG.__dict__,
        "rounds": args.rounds,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "results": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
