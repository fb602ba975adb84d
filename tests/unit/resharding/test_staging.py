"""A destination's staging buffers in one process: laid out like ``allocate_destination``, a
buffer is not handed out again while any view of it lives (however derived), results passed
back are recognised, views outlive ``close`` (the mapping goes with the last of them), and a
``/dev/shm`` too small for a buffer fails at ``reserve`` with an OSError instead of killing a
writer with SIGBUS."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridflow.models.families import DecoderDims
from hybridflow.models.families.decoder import decoder_topology
from hybridflow.resharding.plan import make_plan
from hybridflow.weights.transport.reference import allocate_destination
from hybridflow.weights.transport.shm import Segment, segment_name
from hybridflow.weights.transport.staging import (
    HEADER_BYTES,
    StagingBuffers,
    layout_views,
    staging_layout,
    storage_use_count,
)
from tests.helpers import small_tmpfs as mount_small_tmpfs


def _plan():  # type: ignore[no-untyped-def]
    dims = DecoderDims(
        hidden=16, intermediate=24, num_heads=4, num_kv_heads=2, head_dim=4, vocab=30,
        num_layers=2, tie_embeddings=False, dtype="float32",
    )  # fmt: skip
    return make_plan(decoder_topology(dims, fused=True), 2, [2], 4096)


@pytest.fixture
def staging() -> Iterator[StagingBuffers]:
    layout, size = staging_layout(_plan(), 0, 1)
    name = f"unit-{uuid.uuid4().hex[:8]}"
    segments = [Segment(segment_name(name, 3, b), size, True) for b in range(2)]
    for segment in segments:
        segment.unlink()
    buffers = StagingBuffers(segments, layout)
    yield buffers
    buffers.close()


def test_layout_matches_allocate_destination_and_is_aligned() -> None:
    plan = _plan()
    layout, size = staging_layout(plan, 0, 1)
    want = allocate_destination(plan, 0, 1, device="meta")
    assert list(layout) == list(want)
    end = HEADER_BYTES
    for name, slot in layout.items():
        assert (slot.shape, slot.dtype) == (tuple(want[name].shape), want[name].dtype)
        assert slot.offset % 64 == 0 and slot.offset >= end  # in order, never overlapping
        end = slot.offset + slot.num_bytes
    assert end <= size


def test_a_buffer_is_reused_only_once_no_view_of_it_lives(staging: StagingBuffers) -> None:
    assert storage_use_count(torch.zeros(1)) is not None, (
        "this torch cannot count a storage's users"
    )
    assert staging.lends
    first = staging.acquire(timeout_s=0)
    result = staging.views(first)
    result["model.norm.weight"].fill_(7)
    second = staging.acquire(timeout_s=0)
    assert second != first  # the first result is still referenced
    kept = result["model.norm.weight"][1:3]  # a view derived from a result holds it too
    del result
    held = staging.views(second)
    with pytest.raises(RuntimeError, match="every staging buffer still holds weights"):
        staging.acquire(timeout_s=0)
    assert kept.tolist() == [7.0, 7.0]
    del kept
    assert staging.acquire(timeout_s=0) == first
    assert staging.index_of(held) == second  # a result passed back is recognised
    assert staging.index_of(allocate_destination(_plan(), 0, 1)) is None


def _mapped(name: str) -> bool:
    return name in Path("/proc/self/maps").read_text()


def test_views_stay_valid_after_close_and_the_last_one_unmaps(staging: StagingBuffers) -> None:
    index = staging.acquire(timeout_s=0)
    name = staging.segments[index].name
    views = staging.views(index)
    views["model.norm.weight"].fill_(3)
    staging.close()
    assert views["model.norm.weight"].sum().item() == 3 * views["model.norm.weight"].numel()
    assert _mapped(name)
    del views
    assert not _mapped(name)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mount_small_tmpfs(tmp_path / "shm", "64k") as directory:
        yield directory


def test_a_segment_too_big_for_dev_shm_fails_at_reserve(small_tmpfs: Path) -> None:
    big = Segment("hfws-1-too-big", 1 << 20, True, directory=small_tmpfs)
    small = Segment("hfws-1-fits", 32 << 10, True, directory=small_tmpfs)
    try:
        with pytest.raises(OSError):
            big.reserve()
        assert not big.reserved
        big.reserve(4096)  # the header's page fits
        small.reserve()
        assert small.reserved
        small.tensor.fill_(1)  # every page is there: no SIGBUS
        assert int(small.tensor.sum()) == 32 << 10
    finally:
        big.close()
        small.close()


def test_layout_views_are_the_destination_tensors(staging: StagingBuffers) -> None:
    views = layout_views(staging.segments[0], staging.layout)
    for name, slot in staging.layout.items():
        assert views[name].shape == slot.shape and views[name].is_contiguous()
        assert views[name].data_ptr() == staging.segments[0].tensor.data_ptr() + slot.offset
