"""Runs a suite: each variant through deploy/launch.sh (under py-spy when profiling), then
figures, detailed.log, plots and summary.json in results/YYYYMMDD_HHMMSS/.

    python benchmarks/<suite>/run_benchmark.py --config benchmarks/<suite>/config.yaml

A config in the seed guide's layout (model / resources / workload, e.g.
benchmarks/throughput/seed_config.yaml) is translated by ``seed_config.py``; what it cannot
honour is printed as one line per item and kept in summary.json.

Run nothing else on the machine meanwhile: ratios are only meaningful side by side.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common.config import BenchmarkConfig, without_evaluation  # noqa: E402
from benchmarks.common.figures import read_jsonl, run_figures  # noqa: E402
from benchmarks.common.seed_config import (  # noqa: E402
    CPU_MAX_STEPS,
    Machine,
    SeedConfig,
    is_seed_layout,
    translate_seed_config,
)

Ratios = Callable[[dict[str, dict[str, Any]]], dict[str, Any]]


def environment() -> dict[str, Any]:
    import grpc
    import torch
    import transformers

    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {
        "hardware": {
            "cpu": cpu,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "grpc": grpc.__version__,
        },
        "environment": {"lock_sha256": lock_hash()},
        "git_commit": commit,
    }


def lock_file() -> Path:
    """The lock this interpreter's venv was set up from: `make setup` records the device in
    the venv (``.device``: cpu or cuda); a venv without it is a CPU one."""
    marker = Path(sys.prefix) / ".device"
    device = marker.read_text().strip() if marker.is_file() else "cpu"
    return REPO / "requirements" / f"{device}.lock"


def lock_hash() -> str | None:
    """sha256 of the lock file the packages were installed from (None without one)."""
    import hashlib

    lock = lock_file()
    if not lock.is_file():
        return None
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def py_spy() -> str | None:
    """The py-spy executable (PATH or beside this Python), or None."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return spy if Path(spy).exists() else None


def profiled(spy: str, svg: Path, cmd: list[str]) -> list[str]:
    """``cmd`` under py-spy, sampling it and every process it starts, into a flame graph."""
    return [
        spy,
        "record",
        "--subprocesses",
        "--nonblocking",
        "--rate",
        "50",
        "-o",
        str(svg),
        "--",
        *cmd,
    ]


def run_variant(
    cfg: BenchmarkConfig,
    name: str,
    overrides: list[str],
    out: Path,
    profile: bool = False,
    root: Path = REPO,
) -> Path:
    """One launch.sh run into out/name; under py-spy (all processes) when ``profile``.
    ``root``: the source tree whose launch.sh, job file and code run (another checkout's,
    for a side-by-side comparison of two commits)."""
    run_dir = out / name
    cmd = [str(root / "deploy" / "launch.sh"), "--config", cfg.job, "--run-dir", str(run_dir)]
    quiet = [] if cfg.evaluate else without_evaluation(root)
    for o in [*quiet, *cfg.overrides, *overrides]:
        cmd += ["--set", o]
    if profile:
        spy = py_spy()
        if spy is None:
            raise RuntimeError("profiling needs py-spy (pip install py-spy) or profile: false")
        cmd = profiled(spy, out / "profile.svg", cmd)
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(root))
    print(f"[{name}] {' '.join(cmd)}", file=sys.stderr)
    with (out / f"launch_{name}.log").open("w") as log:
        proc = subprocess.run(
            cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=cfg.timeout_s
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"variant {name} failed ({proc.returncode}); see {out / f'launch_{name}.log'}"
        )
    return run_dir


def write_detailed_log(out: Path, names: list[str]) -> None:
    lines = []
    for name in names:
        for e in read_jsonl(out / name / "events.jsonl"):
            stamp = dt.datetime.fromtimestamp(e["start"]).isoformat(timespec="milliseconds")
            extra = " ".join(
                f"{k}={v}" for k, v in e.items() if k not in ("kind", "start", "duration_s")
            )
            lines.append(
                (
                    e["start"],
                    f"{stamp} [{name}] {e['kind']:<8} {e['duration_s'] * 1000:8.1f} ms  {extra}",
                )
            )
    (out / "detailed.log").write_text("\n".join(line for _, line in sorted(lines)) + "\n")


def this_machine() -> Machine:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Machine(num_cpus=len(os.sched_getaffinity(0)), num_gpus=gpus)


def load_suite_config(
    config_path: str, scale_to_machine: bool = True, max_steps: int = CPU_MAX_STEPS
) -> tuple[BenchmarkConfig, list[str] | None]:
    """The suite config and, for a seed-layout file, its translation notices (else None)."""
    import yaml

    from hybridflow.config.loader import ConfigError, load_config

    path = Path(config_path)
    raw = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not is_seed_layout(raw):
        return load_config(BenchmarkConfig, config_path), None
    seed = load_config(SeedConfig, config_path)
    try:
        translated = translate_seed_config(seed, this_machine(), scale_to_machine, max_steps)
    except ValueError as exc:
        raise ConfigError(f"{config_path}: {exc}") from exc
    return translated.config, translated.notices


def run_suite(
    config_path: str,
    extra_overrides: list[str],
    results_root: Path,
    ratios: Ratios,
    scale_to_machine: bool = True,
    max_steps: int = CPU_MAX_STEPS,
) -> Path:
    """Runs every variant of the suite config (or seed-layout file) at ``config_path``.

    ``scale_to_machine`` and ``max_steps`` apply to seed-layout files only."""
    from hybridflow.config.loader import to_dict

    cfg, notices = load_suite_config(config_path, scale_to_machine, max_steps)
    for line in notices or []:
        print(line, file=sys.stderr)
    cfg.overrides = [*cfg.overrides, *extra_overrides]
    out = results_root / time.strftime("%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in cfg.variants}
    # Variants alternate within each repeat, so slow drift of a noisy machine hits all alike.
    for r in range(cfg.repeats):
        for variant in cfg.variants:
            name = variant.name if r == 0 else f"{variant.name}_r{r + 1}"
            run_dir = run_variant(cfg, name, variant.overrides, out)
            runs[variant.name].append(run_figures(run_dir, cfg.warmup_steps))
            e2e = runs[variant.name][-1]["e2e_samples_per_s"]
            print(f"[{name}] e2e {e2e:.1f} samples/s", file=sys.stderr)
    figures = {name: median_figures(found) for name, found in runs.items()}
    names = [v.name for v in cfg.variants]
    write_detailed_log(out, names)
    if cfg.profile:
        # A separate, shorter run under the sampling profiler: py-spy costs CPU, so the timed
        # runs above stay unprofiled (on 2 cores it would skew the ratios).
        first = cfg.variants[0]
        run_variant(
            cfg,
            "profiled",
            [*first.overrides, f"coordinator.num_steps={cfg.profile_steps}"],
            out,
            profile=True,
        )
    if cfg.plots:
        from benchmarks.common.plots import plot_all

        plot_all(out, names)
    summary = {
        "suite": cfg.suite,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "variants": figures,
        "ratios": ratios(figures),
        **environment(),
        "config": to_dict(cfg),
        **({} if notices is None else {"seed_config": {"file": config_path, "notices": notices}}),
        "job_configs": {n: (out / n / "config.yaml").read_text() for n in names},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"ratios": summary["ratios"]}, indent=2))
    print(f"results: {out}", file=sys.stderr)
    return out


def median_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over repeats (non-numbers from the first run; peak RSS per
    service too), plus the per-repeat end-to-end rates and peak RSS so the spread stays
    visible (the baseline sizes its memory tolerances from it)."""
    import statistics

    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    out["repeats_e2e_samples_per_s"] = [r["e2e_samples_per_s"] for r in runs]
    rss = [r.get("peak_rss_bytes") or {} for r in runs]
    if rss[0]:
        out["peak_rss_bytes"] = {k: int(statistics.median(m[k] for m in rss)) for k in rss[0]}
        out["repeats_peak_rss_bytes"] = rss
    return out


def suite_arg_parser(
    default_config: str,
    description: str | None = None,
    set_help: str = "job override for every variant",
) -> argparse.ArgumentParser:
    """--config, --set (repeatable) and --results, the arguments every suite takes."""
    parser = argparse.ArgumentParser(
        description=description or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=default_config)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    parser.add_argument("--results", type=Path, default=REPO / "results")
    return parser


def main(default_config: str, ratios: Ratios, argv: list[str] | None = None) -> int:
    from hybridflow.config.loader import ConfigError

    parser = suite_arg_parser(default_config)
    parser.add_argument(
        "--scale-to-machine",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="seed-layout configs: cap learner ranks and rollout replicas at this machine's "
        "CPUs and steps at --max-steps (default: on)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=CPU_MAX_STEPS,
        help=f"seed-layout configs: steps cap when scaling (default {CPU_MAX_STEPS})",
    )
    args = parser.parse_args(argv)
    try:
        run_suite(
            args.config, args.set, args.results, ratios, args.scale_to_machine, args.max_steps
        )
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    return 0
