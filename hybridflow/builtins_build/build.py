"""Rebuild the shipped built-in models, deliberately: ``make builtins`` (or ``python -m
hybridflow.builtins_build.build [NAME ...]``).

Each named built-in (default: all) is built from its spec into a temporary directory and
measured (``quality.py``); one that misses a gate is not saved, and the command says
which gate with one line per miss and exits 1. A built-in that passes replaces its files
under ``hybridflow/models/shipped/<name>/`` and its manifest entry (hashes, spec hash, the
numbers, the machine). Commit the result: that is what every user then loads.

``--check`` builds nothing: it verifies the shipped files against the manifest, and the
manifest's spec hashes against the specs, measures the shipped weights on this machine and
prints the numbers (exit 1 on any mismatch or missed gate).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from hybridflow.builtins_build.policy import build_checkpoint
from hybridflow.builtins_build.quality import measure, shortfalls
from hybridflow.builtins_build.reward_model import build_reward_checkpoint
from hybridflow.models.builtin import (
    SHIPPED_DIR,
    AnySpec,
    ShippedModel,
    builtin_specs,
    file_sha256,
    mismatches,
    read_manifest,
    spec_hash,
    write_manifest,
)
from hybridflow.models.builtin_rm import RewardModelSpec


def build_one(name: str, spec: AnySpec, out_dir: Path) -> dict[str, float]:
    """Builds ``name`` from ``spec`` into ``out_dir`` and returns its quality numbers; raises
    ValueError naming every missed gate (``out_dir`` then holds the refused build)."""
    if isinstance(spec, RewardModelSpec):
        build_reward_checkpoint(spec, out_dir)
    else:
        build_checkpoint(spec, out_dir)
    numbers = measure(name, out_dir)
    missed = shortfalls(name, numbers)
    if missed:
        raise ValueError(
            f"builtin:{name} is below its quality gates, not saved: {'; '.join(missed)}"
        )
    return numbers


def machine() -> str:
    """A short description of the building machine (CPU model when Linux says it)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}; {platform.system()} {platform.machine()}"


def rebuild(names: list[str], shipped_dir: Path = SHIPPED_DIR) -> int:
    """Builds, gates and ships ``names``; returns the exit status."""
    specs = builtin_specs()
    entries = read_manifest(shipped_dir) if (shipped_dir / "manifest.json").exists() else {}
    status = 0
    for name in names:
        print(f"building builtin:{name} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                numbers = build_one(name, specs[name], Path(tmp))
            except ValueError as err:
                print(err, file=sys.stderr)
                status = 1
                continue
            target = shipped_dir / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(tmp, target)
        files = {p.name: file_sha256(p) for p in sorted(target.iterdir())}
        entries[name] = ShippedModel(name, spec_hash(specs[name]), files, numbers, machine())
        write_manifest(entries, shipped_dir)
        print(f"builtin:{name}: {_numbers_line(numbers)}; saved to {target}")
    return status


def check(shipped_dir: Path = SHIPPED_DIR) -> int:
    """Verifies and measures the shipped built-ins; returns the exit status."""
    specs = builtin_specs()
    entries = read_manifest(shipped_dir)
    status = 0
    for name in sorted(specs):
        entry = entries.get(name)
        if entry is None:
            print(f"builtin:{name}: not shipped (run `make builtins`)", file=sys.stderr)
            status = 1
            continue
        problems = mismatches(shipped_dir / name, entry.files)
        if entry.spec_hash != spec_hash(specs[name]):
            problems.append(
                f"built from spec {entry.spec_hash}, the spec is now {spec_hash(specs[name])}"
            )
        numbers: dict[str, float] = {}
        if not problems:  # measure only the bytes the manifest vouches for
            numbers = measure(name, shipped_dir / name)
            problems = shortfalls(name, numbers)
        print(f"builtin:{name} {entry.digest}: {_numbers_line(numbers) or '-'}")
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        status |= bool(problems)
    return status


def _numbers_line(numbers: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.3f}" for key, value in sorted(numbers.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.builtins_build.build")
    parser.add_argument("names", nargs="*", help="built-ins to rebuild (default: all)")
    parser.add_argument("--check", action="store_true", help="verify and measure, build nothing")
    args = parser.parse_args(argv)
    known = sorted(builtin_specs())
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown built-ins {unknown}; known: {known}")
    if args.check:
        return check()
    return rebuild(args.names or known)


if __name__ == "__main__":
    sys.exit(main())
