"""The checkpoint manifest: written atomically, and every kind of damage is named by file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hybridflow.errors import CheckpointCorrupt
from hybridflow.utils import manifest


def _checkpoint(root: Path) -> Path:
    (root / "dcp").mkdir(parents=True)
    (root / "dcp" / "__0_0.distcp").write_bytes(bytes(range(256)) * 64)
    (root / "dcp" / ".metadata").write_bytes(b"metadata" * 10)
    (root / "rank0.pt").write_bytes(b"rng" * 30)
    (root / "COMPLETE").write_text("ok\n")
    names = manifest.list_files(root)
    manifest.write_manifest(root, manifest.hash_files(root, names))
    return root


def test_lists_every_file_but_itself_and_complete_and_verifies(tmp_path):
    root = _checkpoint(tmp_path / "ckpt")
    assert manifest.list_files(root) == ["dcp/.metadata", "dcp/__0_0.distcp", "rank0.pt"]
    entries = manifest.read_manifest(root)
    assert entries["rank0.pt"].size_bytes == 90
    manifest.verify(root)
    assert not (root / "MANIFEST.json.tmp").exists()


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip16(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(1000, 1016):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _random(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


@pytest.mark.parametrize(
    ("damage", "name", "says"),
    [
        (_truncate, "dcp/__0_0.distcp", "8192 bytes, the manifest says 16384"),
        (Path.unlink, "dcp/.metadata", "missing"),
        (_random, "dcp/__0_0.distcp", "content differs from the manifest (sha256 mismatch)"),
        (_flip16, "dcp/__0_0.distcp", "content differs from the manifest (sha256 mismatch)"),
        (Path.unlink, "rank0.pt", "missing"),
    ],
)
def test_each_damage_is_refused_naming_the_file(tmp_path, damage, name, says):
    root = _checkpoint(tmp_path / "ckpt")
    damage(root / name)
    with pytest.raises(CheckpointCorrupt) as err:
        manifest.verify(root)
    assert str(err.value) == f"{root / name}: {says}"
    assert "\n" not in str(err.value)


def test_a_missing_or_unreadable_manifest_is_refused(tmp_path):
    root = _checkpoint(tmp_path / "ckpt")
    (root / "MANIFEST.json").write_text('{"files": ')
    with pytest.raises(CheckpointCorrupt, match=r"MANIFEST.json: unreadable"):
        manifest.verify(root)
    (root / "MANIFEST.json").write_text(json.dumps({"format_version": 99, "files": {}}))
    with pytest.raises(CheckpointCorrupt, match=r"format_version 99"):
        manifest.verify(root)
    (root / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointCorrupt, match=r"MANIFEST.json: missing"):
        manifest.verify(root)


def test_check_files_checks_only_the_names_given(tmp_path):
    root = _checkpoint(tmp_path / "ckpt")
    (root / "rank0.pt").unlink()
    entries = manifest.read_manifest(root)
    assert manifest.check_files(root, entries, ["dcp/.metadata"]) == []
    assert manifest.check_files(root, entries) == [f"{root / 'rank0.pt'}: missing"]
