"""hybridflow against TRL's ``GRPOTrainer`` at the 0.5B shape, side by side (issue 45).

    python benchmarks/vs_trl/run_benchmark.py [--repeats 3] [--steps 5]
        [--variants trl,hf_sync,hf_async,vllm_sync,vllm_async,trl_keep_malloc,vllm_sync_keep,...]
        [--workload 0.5b|quickstart] [--results results]

One workload (``workload.py``; by default ``builtin:qwen2.5-0.5b-shape`` fp32, 8
``builtin:arith`` prompts x 8 completions of 4 tokens, binary reward, one optimizer step a
batch in micro-batches of 8; ``--workload quickstart``: the quickstart's job, evaluation off,
against TRL on the same tiny model and batch, where the start-up is most of the wall) on every
variant, each run a fresh launch, the variants interleaved repeat after repeat. ``--steps``
timed steps follow one warm-up step on every variant.

The thread budget is the machine's 2 cores, shared this way:
- ``trl``: one process, 2 threads (it generates and trains in turn); ``trl_keep_malloc``
  the same with hybridflow's allocator setting (``hybridflow/utils/malloc.py``), to show what
  that setting alone buys TRL (not run unless asked);
- ``*_sync``: rollout and learner 2 threads each; they take turns (generate, then train),
  so 2 cores are busy at a time (the reward service scores with Python only);
- ``*_async`` (``max_staleness`` 2, truncated importance sampling): rollout and learner
  1 thread each, since they run at the same time; ``hf_async_learner2`` (not run unless
  asked) gives the learner 2 threads beside the rollout's 1: 3 threads on 2 cores, the
  learner taking both while the rollout waits for the next weights;
  ``vllm_async_unshared`` (not run unless asked) is ``vllm_async`` with every sample in its
  own row (``learner.memory.shared_prompts: false``, the learner before 2026-12-07);
  ``vllm_sync_keep`` (not run unless asked) is ``vllm_sync`` with ``HYBRIDFLOW_MALLOC=keep``,
  whose vLLM workers keep freed memory too (``hybridflow/utils/malloc.py``).

Reports per variant (median over repeats): s/step and completions/s over the timed steps,
the split of a step (generate / score / train / weight sync), the seconds from launch to the
end of the first step, and each process's peak RSS; ratios to TRL. Each run also keeps its
start-up marks (``startup_marks``: hybridflow's ``startup.jsonl`` phases, seconds since the
launch, as ``benchmarks/startup/phases.py`` prints them; TRL's imports, trainer built and first
step, since its process started); the summary holds their medians per variant, and the
report prints the main ones. Writes
``results/vs_trl_YYYYMMDD_HHMMSS/summary.json``. Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common.figures import read_jsonl, run_figures  # noqa: E402
from benchmarks.compare.quiet import busy_report  # noqa: E402
from benchmarks.startup.phases import phase_rows  # noqa: E402
from benchmarks.vs_trl.workload import WORKLOAD, WORKLOADS  # noqa: E402

JOB = WORKLOAD.job
ASYNC = ["coordinator.max_staleness=2", "learner.loss.off_policy=tis"]
VARIANTS: dict[str, list[str]] = {
    "hf_sync": ["rollout.engine=hf", "rollout.num_threads=2", "learner.topology.num_threads=2"],
    "hf_async": ["rollout.engine=hf", "rollout.num_threads=1", "learner.topology.num_threads=1",
                 *ASYNC],
    "vllm_sync": ["rollout.engine=vllm", "rollout.num_threads=2",
                  "learner.topology.num_threads=2"],
    "vllm_async": ["rollout.engine=vllm", "rollout.num_threads=1",
                   "learner.topology.num_threads=1", *ASYNC],
    "hf_async_learner2": ["rollout.engine=hf", "rollout.num_threads=1",
                          "learner.topology.num_threads=2", *ASYNC],
    "vllm_sync_keep": ["rollout.engine=vllm", "rollout.num_threads=2",
                       "learner.topology.num_threads=2"],
    "vllm_async_unshared": ["rollout.engine=vllm", "rollout.num_threads=1",
                            "learner.topology.num_threads=1", *ASYNC,
                            "learner.memory.shared_prompts=false"],
}  # fmt: skip
"""hybridflow's variants: overrides of ``JOB``."""
VARIANT_ENV: dict[str, dict[str, str]] = {"vllm_sync_keep": {"HYBRIDFLOW_MALLOC": "keep"}}
"""Environment a variant launches with, beyond this process's."""
DEFAULT = ["trl", "hf_sync", "hf_async", "vllm_sync", "vllm_async"]
"""What runs unless ``--variants`` says otherwise."""
TRL = "trl"
TRL_KEEP = "trl_keep_malloc"
"""TRL with hybridflow's allocator setting (``trl_run.py --keep-freed-memory``)."""


def run_trl(out: Path, name: str, steps: int, workload: str = "0.5b") -> dict[str, Any]:
    """One TRL run of 1 + ``steps`` steps of ``workload`` (a ``WORKLOADS`` key); its figures
    over the last ``steps``."""
    path = out / f"{name}.json"
    cmd = [sys.executable, str(REPO / "benchmarks/vs_trl/trl_run.py"), "--steps", str(steps + 1),
           "--threads", "2", "--out", str(path), "--workload", workload]  # fmt: skip
    if name == TRL_KEEP:
        cmd.append("--keep-freed-memory")
    with (out / f"{name}.log").open("w") as log:
        subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    result = json.loads(path.read_text())
    timed = result["steps"][1:]
    wall = sum(r["step_s"] for r in timed)
    return {
        "step_s": wall / len(timed),
        "completions_per_s": WORKLOADS[workload].completions_per_step * len(timed) / wall,
        "generate_s": statistics.mean(r["generate_s"] for r in timed),
        "score_s": statistics.mean(r["score_s"] for r in timed),
        "train_s": statistics.mean(r["train_s"] for r in timed),
        "sync_s": 0.0,
        "first_step_s": result["first_step_s"],
        "startup_marks": result["startup_marks"],
        "peak_rss_mb": {name: result["peak_rss_bytes"] / 2**20},
    }


def run_hybridflow(out: Path, name: str, steps: int, workload: str = "0.5b") -> dict[str, Any]:
    """One ``deploy/launch.sh`` run of 1 + ``steps`` steps of ``workload`` (a ``WORKLOADS``
    key); its figures over the last ``steps``."""
    job = WORKLOADS[workload]
    run_dir = out / name
    cmd = ["deploy/launch.sh", "--config", job.job, "--run-dir", str(run_dir),
           "--set", f"coordinator.num_steps={steps + 1}"]  # fmt: skip
    for override in (*job.job_overrides, *VARIANTS[name]):
        cmd += ["--set", override]
    env = dict(os.environ, PYTHON=sys.executable, **VARIANT_ENV.get(name, {}))
    started = time.time()
    try:
        with (out / f"{name}.log").open("w") as log:
            subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    finally:  # the end-of-run train state: 6 GB at this shape, a full disk after a few runs
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    figures = run_figures(run_dir, warmup_steps=1)
    first = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if "timing_s/step" in r)
    wall = figures["wall_s"]
    return {
        "step_s": wall / figures["steps_timed"],
        "completions_per_s": job.completions_per_step * figures["steps_timed"] / wall,
        "generate_s": figures["mean_gen_s_per_step"],
        "score_s": figures["mean_score_s_per_step"],
        "train_s": figures["mean_learner_compute_s"],
        "sync_s": figures["mean_sync_s"],
        "first_step_s": first["time"] - started,
        "startup_marks": {
            f"{row['process']}/{row['phase']}": row["at_s"] for row in phase_rows(run_dir)
        },
        "peak_rss_mb": {k: v / 2**20 for k, v in figures["peak_rss_bytes"].items()},
    }


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each variant's median over its repeats, and its ratios to TRL's medians."""
    table: dict[str, dict[str, Any]] = {}
    for name, results in runs.items():
        row: dict[str, Any] = {
            key: statistics.median(r[key] for r in results)
            for key in ("step_s", "completions_per_s", "generate_s", "score_s", "train_s",
                        "sync_s", "first_step_s")
        }  # fmt: skip
        row["peak_rss_mb"] = {
            proc: max(r["peak_rss_mb"][proc] for r in results) for proc in results[0]["peak_rss_mb"]
        }
        row["completions_per_s_each"] = [r["completions_per_s"] for r in results]
        table[name] = row
    if TRL in table:
        base = table[TRL]
        for row in table.values():
            row["vs_trl_completions_per_s"] = row["completions_per_s"] / base["completions_per_s"]
            row["vs_trl_train_s"] = base["train_s"] / row["train_s"] if row["train_s"] else None
            row["first_step_vs_trl"] = row["first_step_s"] / base["first_step_s"]
    return table


STARTUP_SHOWN = ("imported", "tokenizer", "serving", "healthy", "trainer_built", "first_step_done")
"""The start-up marks the report prints (a mark's name ends with one of these)."""


def startup_medians(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Each variant's start-up marks: the median over its repeats of when each ended."""
    medians: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        keys = [
            k for k in results[0]["startup_marks"] if all(k in r["startup_marks"] for r in results)
        ]
        row = {k: statistics.median(r["startup_marks"][k] for r in results) for k in keys}
        medians[name] = dict(sorted(row.items(), key=lambda item: item[1]))
    return medians


def print_startup(medians: dict[str, dict[str, float]]) -> None:
    print("start-up, seconds since launch (medians):")
    for name, marks in medians.items():
        shown = [f"{k} {v:.2f}" for k, v in marks.items() if k.endswith(STARTUP_SHOWN)]
        print(f"  {name}: " + ", ".join(shown))


def print_table(table: dict[str, dict[str, Any]]) -> None:
    print(f"{'variant':<11} {'s/step':>7} {'compl/s':>8} {'vs TRL':>7} {'gen':>6} {'score':>6} "
          f"{'train':>6} {'sync':>6} {'1st step':>9}  peak RSS MB")  # fmt: skip
    for name, r in table.items():
        rss = ", ".join(f"{k} {v:,.0f}" for k, v in r["peak_rss_mb"].items())
        print(f"{name:<11} {r['step_s']:7.2f} {r['completions_per_s']:8.2f} "
              f"{r.get('vs_trl_completions_per_s', float('nan')):7.2f} {r['generate_s']:6.2f} "
              f"{r['score_s']:6.2f} {r['train_s']:6.2f} {r['sync_s']:6.2f} "
              f"{r['first_step_s']:9.1f}  {rss}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up")
    parser.add_argument("--variants", default=",".join(DEFAULT))
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="0.5b")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in (TRL, TRL_KEEP) and n not in VARIANTS]
    if unknown or args.repeats < 1 or args.steps < 1:
        parser.error(
            f"unknown variants {unknown} (of {[TRL, TRL_KEEP, *VARIANTS]}), or repeats/steps < 1"
        )
    busy = busy_report()
    if busy:
        print(f"warning: the machine is busy before the start ({busy})", file=sys.stderr)
    out = args.results / f"vs_trl_{dt.datetime.now():%Y%m%d_%H%M%S}"
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for repeat in range(args.repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        for name in order:
            where = out / f"repeat{repeat}"
            where.mkdir(parents=True, exist_ok=True)
            result = (
                run_trl(where, name, args.steps, args.workload)
                if name in (TRL, TRL_KEEP)
                else run_hybridflow(where, name, args.steps, args.workload)
            )
            runs[name].append(result)
            print(f"repeat {repeat + 1}/{args.repeats} {name}: {result['step_s']:.2f} s/step, "
                  f"first step at {result['first_step_s']:.1f} s", flush=True)  # fmt: skip
    table = summarise(runs)
    print_table(table)
    startup = startup_medians(runs)
    print_startup(startup)
    summary = {"workload": {"name": args.workload, **WORKLOADS[args.workload].__dict__},
               "steps": args.steps, "repeats": args.repeats, "table": table,
               "startup": startup, "runs": runs}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
