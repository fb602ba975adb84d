"""The learner's train step at the 0.5B shape under one setting against another, side by
side, each repeat in a fresh process, the settings alternating. The settings:

- ``full_logits``: the output head on every position (``learner.memory.full_logits: true``,
  what the learner computed before), glibc's malloc as it comes;
- ``response_head``: the head on the response positions only (the default), glibc's malloc
  as it comes (``HYBRIDFLOW_MALLOC=system``);
- ``keep_malloc``: the learner service as it runs: the response head and the allocator that
  keeps freed memory (``hybridflow.utils.malloc``);
- ``keep_hugepages``: ``keep_malloc`` with the heap in transparent huge pages (glibc's
  ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``), which makes growing the heap (the first steps)
  fault once per 2 MB rather than per 4 KB page;
- ``keep_unshared``: ``keep_malloc`` with every sample in its own row
  (``learner.memory.shared_prompts: false``, what the learner computed before
  2026-12-07), against ``keep_malloc``'s one row per prompt (each group's prompt runs once).

The workload is issue 45's: ``builtin:qwen2.5-0.5b-shape`` (Qwen2.5-0.5B's dims, random init,
fp32), 8 ``builtin:arith`` prompts rendered by its chat template x 8 completions of 4 tokens,
binary rewards, one GRPO train step (``deploy/configs/qwen2.5-0.5b-shape.yaml``'s learner:
micro-batches of 4) in one process with ``--threads`` threads (the machine alone: 2).

    python benchmarks/learner_head/run_benchmark.py [--repeats 3] [--steps 3] [--threads 2]
        [--settings response_head,keep_malloc] [--set learner.update.micro_batch_size=16]

Each process times ``--steps`` train steps after one warm-up step and reports their median,
the warm-up's seconds (what the heap's growth costs a first step), each step's page faults
and kernel seconds (the warm-up's first), and its peak RSS; the summary gives each
setting's median over the repeats and the ratios of the pairs that ran. Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MALLOC_ENV = "HYBRIDFLOW_MALLOC"

SETTINGS: dict[str, dict[str, Any]] = {
    # the head on every position / on the response positions only (glibc's malloc as is)
    "full_logits": {"set": ["learner.memory.full_logits=true"], "env": {MALLOC_ENV: "system"}},
    "response_head": {"set": [], "env": {MALLOC_ENV: "system"}},
    # the learner service's allocator: freed memory kept (hybridflow.utils.malloc)
    "keep_malloc": {"set": [], "env": {MALLOC_ENV: "keep"}},
    # the same, each sample's prompt run in its own row (no shared prompts)
    "keep_unshared": {"set": ["learner.memory.shared_prompts=false"], "env": {MALLOC_ENV: "keep"}},
    # the same, the heap in transparent huge pages (glibc's tunable, read at process start)
    "keep_hugepages": {
        "set": [],
        "env": {MALLOC_ENV: "keep", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    },
}
PAIRS = (
    ("full_logits", "response_head"),
    ("response_head", "keep_malloc"),
    ("keep_malloc", "keep_hugepages"),
    ("keep_unshared", "keep_malloc"),
)
"""(before, after) pairs whose ratio the summary gives when both ran."""
CONFIG = REPO / "deploy" / "configs" / "qwen2.5-0.5b-shape.yaml"


def child(setting: str, steps: int, threads: int, extra: list[str]) -> dict[str, Any]:
    import resource

    from hybridflow.main.bootstrap import setup_torch_process

    setup_torch_process(threads)  # as the learner service: threads, allocator
    from hybridflow.data.arith import make_arith_rows
    from hybridflow.job_config import load_job_config
    from hybridflow.models import resolve_model_path
    from hybridflow.models.text_only import load_tokenizer
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.types import TrainSample

    # The worker sets its threads from the config (learner.topology.num_threads): the shape
    # config's 1, unless set here.
    overrides = [f"learner.topology.num_threads={threads}", *SETTINGS[setting]["set"], *extra]
    job = load_job_config(CONFIG, overrides)
    path = resolve_model_path(job.model)
    tokenizer = load_tokenizer(path)
    rng = random.Random(0)
    samples = []
    for group, row in enumerate(make_arith_rows(8, seed=0)):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)
        for k in range(8):
            samples.append(
                TrainSample(
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(1000, 20000) for _ in range(4)],
                    rollout_logprobs=[-5.0] * 4,
                    reward=float((group + k) % 2),
                    group_id=group,
                    policy_version=0,
                )
            )
    worker = LearnerWorker(job.learner, path)
    seconds, faults, kernel_s = [], [], []
    for _ in range(1 + steps):  # a warm-up step, then the timed ones
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        worker.train_step(samples)
        seconds.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_SELF)
        faults.append(after.ru_minflt - before.ru_minflt)
        kernel_s.append(after.ru_stime - before.ru_stime)
    peak_kb = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM:")
    )
    return {
        "setting": setting,
        "step_s": statistics.median(seconds[1:]),
        "warmup_s": seconds[0],
        "steps_s": seconds[1:],
        "page_faults": faults,  # the warm-up's first
        "kernel_s": kernel_s,
        "peak_rss_mb": peak_kb / 1024,
        "prompt_tokens": len(samples[0].prompt_ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="write the summary JSON here too")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a job config override for both settings (learner.update.micro_batch_size=16)",
    )  # fmt: skip
    parser.add_argument(
        "--settings",
        default="response_head,keep_malloc",
        help=f"which settings to run, comma-separated, of {', '.join(SETTINGS)}",
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.threads, args.set)))
        return
    runs: list[dict[str, Any]] = []
    settings = [s for s in args.settings.split(",") if s]
    for repeat in range(args.repeats):
        for setting in settings:
            command = [sys.executable, __file__, "--child", setting, "--steps", str(args.steps),
                       "--threads", str(args.threads)]  # fmt: skip
            command += [f"--set={kv}" for kv in args.set]
            env = {**os.environ, **SETTINGS[setting]["env"]}
            out = subprocess.run(
                command, check=True, capture_output=True, text=True, cwd=REPO, env=env
            )
            run = json.loads(out.stdout.strip().splitlines()[-1])
            runs.append(run)
            print(f"repeat {repeat + 1}/{args.repeats} {setting}: {run['step_s']:.2f} s/step, "
                  f"warm-up {run['warmup_s']:.1f} s, page faults {run['page_faults']}, kernel s {run['kernel_s']}, "
                  f"peak RSS {run['peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip
    summary: dict[str, Any] = {"runs": runs, "overrides": args.set}
    for setting in settings:
        mine = [r for r in runs if r["setting"] == setting]
        summary[setting] = {
            "step_s_median": statistics.median(r["step_s"] for r in mine),
            "warmup_s_median": statistics.median(r["warmup_s"] for r in mine),
            "peak_rss_mb_median": statistics.median(r["peak_rss_mb"] for r in mine),
        }
    for before, after in PAIRS:
        if before in settings and after in settings:
            summary[f"speedup {after} vs {before}"] = (
                summary[before]["step_s_median"] / summary[after]["step_s_median"]
            )
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
