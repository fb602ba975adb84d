"""Every built-in ships its weights pinned by sha256, good enough for what it exists for; the
cache never serves other bytes, and a build below its quality gates is never saved."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from hybridflow.builtins_build.build import build_one, check
from hybridflow.builtins_build.quality import (
    DEFAULT_TOLERANCE,
    GATES,
    TOLERANCE,
    measure,
    shortfalls,
)
from hybridflow.models.builtin import (
    SHIPPED_DIR,
    builtin_names,
    builtin_specs,
    ensure_builtin_model,
    file_sha256,
    mismatches,
    read_manifest,
    spec_hash,
)
from hybridflow.models.builtin_rm import RewardModelSpec


def test_every_builtin_ships_files_matching_its_manifest_and_spec() -> None:
    entries = read_manifest()
    assert sorted(entries) == builtin_names() == sorted(GATES)
    for name, spec in builtin_specs().items():
        entry = entries[name]
        assert mismatches(SHIPPED_DIR / name, entry.files) == [], name
        assert {"config.json", "model.safetensors"} <= set(entry.files), name
        # A spec changed without `make builtins` ships weights of another spec.
        assert entry.spec_hash == spec_hash(spec), f"{name}: rebuild with `make builtins`"


@pytest.mark.parametrize("name", builtin_names())
def test_shipped_weights_pass_their_quality_gates_here(name: str) -> None:
    numbers = measure(name, SHIPPED_DIR / name)
    assert shortfalls(name, numbers) == []
    recorded = read_manifest()[name].quality
    assert recorded.keys() == numbers.keys()
    # The same bytes measured on another CPU: float noise only (at most a near-tie flipping
    # one problem's greedy answer or one pair's order; a few sampled episodes), never a
    # different verdict.
    tolerance = TOLERANCE.get(name, DEFAULT_TOLERANCE)
    assert all(abs(numbers[k] - recorded[k]) <= tolerance for k in numbers), (numbers, recorded)


def test_check_command_passes_on_the_shipped_weights(capsys: pytest.CaptureFixture[str]) -> None:
    assert check() == 0
    out = capsys.readouterr().out
    assert all(f"builtin:{name} {read_manifest()[name].digest}" in out for name in builtin_names())


def test_a_cached_copy_with_other_weights_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = ensure_builtin_model("tiny", root=tmp_path)
    weights = path / "model.safetensors"
    pinned = file_sha256(weights)
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF  # one flipped bit in the last tensor
    weights.write_bytes(bytes(raw))
    (path / "stray.txt").write_text("left by someone")
    with caplog.at_level(logging.WARNING, logger="hybridflow.models.builtin"):
        assert ensure_builtin_model("tiny", root=tmp_path) == path
    assert file_sha256(weights) == pinned and not (path / "stray.txt").exists()
    assert "does not match this version's weights" in caplog.text
    assert "model.safetensors has sha256" in caplog.text


def test_a_corrupt_shipped_file_is_refused_naming_it(tmp_path: Path) -> None:
    shipped = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, shipped)
    (shipped / "tiny-rm" / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"builtin:tiny-rm .*config\.json has sha256"):
        ensure_builtin_model("tiny-rm", root=tmp_path / "cache", shipped_dir=shipped)
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]  # nothing half-made
    with pytest.raises(ValueError, match="unknown builtin model 'tiny-xl'"):
        ensure_builtin_model("tiny-xl", root=tmp_path / "cache", shipped_dir=shipped)


def test_a_build_below_its_gates_is_refused(tmp_path: Path) -> None:
    untrained = RewardModelSpec(
        hidden_size=32, intermediate_size=64, num_attention_heads=1, lm_steps=1, joint_steps=1
    )
    with pytest.raises(ValueError, match=r"builtin:tiny-rm is below its quality gates.*pair_acc"):
        build_one("tiny-rm", untrained, tmp_path)
