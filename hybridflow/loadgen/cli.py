"""``hybridflow-loadgen``: put load on one running rollout or reward service and measure it.

    hybridflow-loadgen --target rollout --address 127.0.0.1:50051 --rate 4 --duration 20
    hybridflow-loadgen --target reward --address 127.0.0.1:50052 --concurrency 8 --requests 500
    hybridflow-loadgen --target rollout --address 127.0.0.1:50051 --duration 15 --warmup 3 \\
        --sweep-rates 1,2,4,8 --out sweep.json          # also writes sweep.png

Open loop (--rate: seeded Poisson arrivals) or closed loop (--concurrency); bounded by
--duration and/or --requests (hard caps apply to both). Requests due during --warmup are
excluded. Latency is measured from when a request was due. Exit status: 0 all requests
succeeded, 1 some failed (see the errors column), 2 bad arguments, 3 target not usable.
Flags override --config YAML (a LoadgenConfig) and --set key=value overrides.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hybridflow.utils.config_args import add_config_args

if TYPE_CHECKING:
    from hybridflow.loadgen.stats import RunSummary

# (flag, config key, type, help): each given flag becomes a ``key=value`` override.
_FLAGS: list[tuple[str, str, type, str]] = [
    ("--target", "target", str, "rollout | reward"),
    ("--address", "address", str, "HOST:PORT of the service (required)"),
    ("--rate", "rate", float, "open loop: Poisson arrivals at this many requests/s"),
    ("--concurrency", "concurrency", int, "closed loop: requests in flight"),
    ("--duration", "duration_s", float, "stop sending after S seconds (warm-up included)"),
    ("--requests", "num_requests", int, "stop after N requests (warm-up included)"),
    ("--warmup", "warmup_s", float, "exclude requests due in the first S seconds"),
    ("--timeout", "timeout_s", float, "deadline of each request in seconds (default 30)"),
    ("--seed", "seed", int, "seed of arrivals and request contents (default 0)"),
    ("--max-new-tokens", "rollout.max_new_tokens", int, "rollout: tokens per completion"),
    ("--temperature", "rollout.temperature", float, "rollout: sampling temperature"),
    ("--top-p", "rollout.top_p", float, "rollout: nucleus mass"),
    ("--n", "rollout.n", int, "rollout: completions per prompt"),
    ("--batch-size", "rollout.prompts_per_request", int, "rollout: prompts per request"),
    ("--items-per-request", "reward.items_per_request", int, "reward: items per request"),
    ("--correct-fraction", "reward.correct_fraction", float, "reward: share of right answers"),
    ("--out", "out", str, "write the JSON report here"),
    ("--plot", "plot", str, "sweep PNG path (default: --out with .png)"),
]


def _number_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from exc
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def _prompt_len(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi or lo)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridflow-loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(parser, "LoadgenConfig YAML (e.g. benchmarks/loadgen/*.yaml)", "rate=4")
    for flag, key, kind, text in _FLAGS:
        metavar = flag[2:].upper().replace("-", "_")
        parser.add_argument(
            flag, dest=key.replace(".", "__"), type=kind, metavar=metavar, help=text
        )
    parser.add_argument(
        "--prompt-len", type=_prompt_len, metavar="N|MIN:MAX", help="rollout: prompt tokens"
    )
    parser.add_argument("--sweep-rates", type=_number_list, help="open-loop sweep, e.g. 1,2,4,8")
    parser.add_argument(
        "--sweep-concurrency", type=_number_list, help="closed-loop sweep, e.g. 1,2,4,8"
    )
    return parser


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The given flags as ``key=value`` overrides (values as YAML/JSON scalars)."""
    overrides = []
    for _, key, _, _ in _FLAGS:
        value = getattr(args, key.replace(".", "__"))
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if args.prompt_len is not None:
        overrides.append(f"rollout.prompt_len_min={args.prompt_len[0]}")
        overrides.append(f"rollout.prompt_len_max={args.prompt_len[1]}")
    if args.sweep_rates is not None:
        overrides.append(f"sweep_rates={json.dumps(args.sweep_rates)}")
    if args.sweep_concurrency is not None:
        ints = [int(c) for c in args.sweep_concurrency]
        if ints != args.sweep_concurrency:
            raise ValueError(f"sweep_concurrency must be integers, got {args.sweep_concurrency}")
        overrides.append(f"sweep_concurrency={json.dumps(ints)}")
    return overrides


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    from hybridflow.config.loader import load_config, to_dict
    from hybridflow.loadgen.config import LoadgenConfig, is_loopback

    try:
        cfg = load_config(LoadgenConfig, args.config, [*args.set, *flag_overrides(args)])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plot_path = cfg.plot_path()
    if plot_path:
        try:
            import matplotlib  # noqa: F401 — fail before the run, not after it
        except ImportError:
            print("error: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    if not is_loopback(cfg.address):
        print(f"note: loading a non-loopback address: {cfg.address}", file=sys.stderr)

    import asyncio

    from hybridflow.loadgen.report import build_report, environment, format_table
    from hybridflow.loadgen.sweep import run_points
    from hybridflow.loadgen.targets import TargetUnavailable

    def on_point(summary: RunSummary) -> None:
        if cfg.is_sweep:  # progress: one table per point while the sweep runs
            print(format_table([summary], cfg.target), file=sys.stderr, flush=True)

    try:
        summaries = asyncio.run(run_points(cfg, on_point))
    except TargetUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(format_table(summaries, cfg.target))
    if cfg.out:
        report = build_report(to_dict(cfg), summaries, environment())
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {cfg.out}")
    if plot_path:
        from hybridflow.loadgen.plot import plot_sweep

        plot_sweep(summaries, cfg.target, cfg.address, plot_path)
        print(f"wrote {plot_path}")
    return 1 if any(s.num_errors for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
