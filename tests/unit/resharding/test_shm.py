"""Shared-memory segments and tokens in one process: 0600, names unlinked while the mapping
lives, no name reused, stale names of dead creators removed, mismatched tokens refused."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest
import torch

from hybridflow.weights.transport.same_host import check_token
from hybridflow.weights.transport.shm import (
    SHM_DIR,
    Segment,
    aligned,
    host_identity,
    remove_stale_segments,
    segment_name,
)

DEAD_PID = 2**31 - 1  # above any pid_max: os.kill reports no such process


def test_segment_is_private_shared_and_survives_its_name() -> None:
    name = segment_name(f"unit-{uuid.uuid4().hex[:8]}", 2, 1)
    assert name.startswith(f"hfws-{os.getpid()}-unit-") and name.endswith("-d2-b1")
    owner = Segment(name, 128, create=True)
    try:
        assert stat.S_IMODE((SHM_DIR / name).stat().st_mode) == 0o600
        with pytest.raises(FileExistsError):
            Segment(name, 128, create=True)
        with pytest.raises(ValueError, match="128 bytes, expected 64"):
            Segment(name, 64, create=False)
        peer = Segment(name, 128, create=False)
        owner.unlink()
        assert not (SHM_DIR / name).exists()
        owner.tensor[5:8] = torch.tensor([7, 8, 9], dtype=torch.uint8)
        assert peer.tensor[5:8].tolist() == [7, 8, 9]  # the mapping outlives the name
        peer.close()
    finally:
        owner.close()
    assert not (SHM_DIR / name).exists()


def test_stale_segments_of_dead_creators_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / f"hfws-{DEAD_PID}-ws1-s0-d2"
    live = tmp_path / f"hfws-{os.getpid()}-ws1-s0-d2"
    other = tmp_path / "psm_1234"
    for path in (dead, live, other):
        path.write_bytes(b"x")
    assert remove_stale_segments(tmp_path) == [dead.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_host_identity_and_alignment() -> None:
    assert host_identity() == host_identity() and "/" in host_identity()
    assert [aligned(n) for n in (1, 64, 65)] == [64, 64, 128]


def test_a_token_for_another_sync_is_refused() -> None:
    check_token(torch.tensor([3, 17]), (3, 17), "done")
    with pytest.raises(RuntimeError, match=r"done: expected \[3, 17\], got \[2, 17\]"):
        check_token(torch.tensor([2, 17]), (3, 17), "done")
