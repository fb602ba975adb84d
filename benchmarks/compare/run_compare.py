"""A commit against this checkout, side by side in one run: the throughput suite for BASE
(a git worktree of it) and HEAD (this working tree), alternating, then a verdict per figure.

    python benchmarks/compare/run_compare.py --base REV [--config benchmarks/compare/ci.yaml]
        [--repeats 6] [--set key=value ...] [--results results]
    make bench-compare BASE=REV

Each repeat runs every variant of the suite config once on each side, back to back, the order
of the two swapped from one variant and repeat to the next (BASE, HEAD, HEAD, BASE, ...), so a
drift of the machine hits both alike. Both sides run from worktrees side by side in the
results folder, paths of one length (BASE's commit, and HEAD's: this checkout's working tree
as it is, uncommitted and untracked files included), each with its own ``deploy/launch.sh``,
job file and code (``PYTHONPATH`` set to its tree) under this Python and its packages: what
differs is the code, never the environment. The verdict (``verdict.py``): a figure fails when
HEAD is worse than BASE by more than the noise the run measured itself. A machine busy with
something else before the start is named (``quiet.py``): its noise makes a run inconclusive.

Exit status: 0 no regression, 1 a regression, 3 too noisy to tell (rerun on a quiet machine),
2 bad arguments. Writes ``results/compare_YYYYMMDD_HHMMSS/compare.json`` and prints a table.
Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common.figures import run_figures  # noqa: E402
from benchmarks.common.runner import environment, load_suite_config, run_variant  # noqa: E402
from benchmarks.compare.quiet import busy_report  # noqa: E402
from benchmarks.compare.verdict import compare, exit_code, figures_compared  # noqa: E402

DEFAULT_CONFIG = "benchmarks/compare/ci.yaml"
MIN_REPEATS = 3
DEFAULT_REPEATS = 6
"""A launch's figures spread ~10 %: 6 launches a side put a 30 % slowdown ~4 standard errors
out and a regression's threshold near 0.85 (verdict.py); 3 are too few to be conclusive."""


def git(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def working_tree_commit(scratch: Path, repo: Path = REPO) -> str:
    """A commit of this checkout's working tree as it is (tracked changes and untracked files
    that git does not ignore), made through a private index: HEAD, the branch and the user's
    index stay as they are."""
    env = dict(os.environ, GIT_INDEX_FILE=str(scratch / "head.index"))
    git("read-tree", "HEAD", cwd=repo, env=env)
    git("add", "--all", cwd=repo, env=env)
    tree = git("write-tree", cwd=repo, env=env)
    return git(
        "-c", "user.name=bench-compare", "-c", "user.email=bench-compare@localhost",
        "commit-tree", tree, "-p", "HEAD", "-m", "bench-compare: the working tree",
        cwd=repo, env=env,
    )  # fmt: skip


def add_worktree(commit: str, where: Path) -> Path:
    git("worktree", "add", "--detach", "--force", str(where), commit)
    return where


def remove_worktree(where: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=REPO, timeout=120)
    subprocess.run(["git", "worktree", "prune"], cwd=REPO, timeout=120)


def run_sides(
    config: str, sides: dict[str, Path], repeats: int, extra: list[str], out: Path
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """{side: {variant: [compared figures of each repeat]}}, the sides back to back per
    variant, their order swapped each time."""
    cfg, notices = load_suite_config(config)
    for line in notices or []:
        print(line, file=sys.stderr)
    cfg.overrides = [*cfg.overrides, *extra]
    found: dict[str, dict[str, list[dict[str, float]]]] = {
        side: {v.name: [] for v in cfg.variants} for side in sides
    }
    names = list(sides)
    for r in range(repeats):
        for v, variant in enumerate(cfg.variants):
            # Each variant's pair swaps every repeat (and neighbouring variants start on
            # different sides), so neither side always goes first for any variant.
            for side in names if (r + v) % 2 == 0 else names[::-1]:
                label = f"{side}_{variant.name}_r{r + 1}"
                run_dir = run_variant(cfg, label, variant.overrides, out, root=sides[side])
                figures = figures_compared(run_figures(run_dir, cfg.warmup_steps))
                found[side][variant.name].append(figures)
                print(
                    f"[{label}] e2e {figures.get('e2e_samples_per_s', 0.0):.1f} samples/s",
                    file=sys.stderr,
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the commit to compare against (any rev)")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the suite config both run")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)
    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be at least {MIN_REPEATS}: the noise is measured from them")
    try:
        base_commit = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    except ValueError as exc:
        parser.error(f"--base {args.base}: {exc}")
    head = git("describe", "--always", "--dirty", "--abbrev=12")
    out = args.results / time.strftime("compare_%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print(f"BASE {base_commit[:12]} ({args.base}) against HEAD {head}; results in {out}")
    busy = busy_report()
    if busy:
        print(f"warning: the machine is not quiet: {busy}", file=sys.stderr)
    trees = {"base": out / "tree-base", "head": out / "tree-head"}
    # A stopped run (Ctrl-C, CI's timeout) still removes its worktrees.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    add_worktree(base_commit, trees["base"])
    try:
        add_worktree(working_tree_commit(out), trees["head"])
        found = run_sides(args.config, trees, args.repeats, args.set, out)
    finally:
        for tree in trees.values():
            remove_worktree(tree)
    verdicts = compare(found["base"], found["head"])
    for v in verdicts:
        print(v.line())
    code = exit_code(verdicts)
    report: dict[str, Any] = {
        "base": {"rev": args.base, "commit": base_commit},
        "head": head,
        "config": args.config,
        "overrides": args.set,
        "repeats": args.repeats,
        "busy_before": busy,
        "verdicts": [
            {**vars(v), "speedup": v.speedup, "noise": v.noise, "status": v.status}
            for v in verdicts
        ],
        "figures": found,
        "exit_code": code,
        **environment(),
    }
    (out / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    print({0: "no regression", 1: "REGRESSION", 3: "inconclusive: too noisy to rule one out"}[code])
    return code


if __name__ == "__main__":
    sys.exit(main())
