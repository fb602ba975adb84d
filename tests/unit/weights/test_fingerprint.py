"""The slice fingerprint a weight sync is checked by (``weights/transport/fingerprint.py``):
exact however a tensor is cut or laid out, and different for the stale slices a sync can leave
behind, including the +1/-1-in-the-last-bit changes that a plain sum misses."""

from __future__ import annotations

import pytest
import torch

from hybridflow.weights.transport import fingerprint as fp_module
from hybridflow.weights.transport.fingerprint import MASK, fingerprint


def _sum_of(parts: list[torch.Tensor]) -> tuple[int, int]:
    prints = [fingerprint(p) for p in parts]
    return sum(p[0] for p in prints) & MASK, sum(p[1] for p in prints) & MASK


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_tensor_cut_any_way_has_the_fingerprint_of_the_whole(dtype, monkeypatch) -> None:
    monkeypatch.setattr(fp_module, "CHUNK_ELEMENTS", 64)  # many chunks, rows split too
    x = torch.randn(37, 150, generator=torch.Generator().manual_seed(0)).to(dtype)
    whole = fingerprint(x)
    assert _sum_of([x[:5], x[5:20], x[20:]]) == whole  # FSDP rows
    assert _sum_of([x[:, :7], x[:, 7:]]) == whole  # a column split (strided views)
    assert _sum_of([x[:10, :70], x[:10, 70:], x[10:]]) == whole  # a TP cut of a row shard
    assert fingerprint(x.t()) == whole and fingerprint(x.reshape(-1)) == whole
    assert fingerprint(x.clone()) == whole


def test_the_empty_and_the_scalar_tensor() -> None:
    assert fingerprint(torch.empty(0, 3)) == (0, 0)
    assert fingerprint(torch.tensor(1.5)) == fingerprint(torch.tensor([1.5]))


def test_one_changed_element_anywhere_changes_it() -> None:
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    whole = fingerprint(x)
    for i, j in [(0, 0), (63, 31), (17, 5)]:
        y = x.clone()
        y[i, j] = torch.nextafter(y[i, j], torch.tensor(float("inf")))
        assert fingerprint(y) != whole


def test_last_bit_moves_that_cancel_in_the_sum_are_caught_by_the_squares() -> None:
    # A bf16 replica after a small optimizer step: two elements moved by one step of their
    # last bit in opposite directions. The integer sum is unchanged; the squares are not.
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    bits = x.view(torch.int16).clone()
    bits[0, 0] += 1
    bits[3, 4] -= 1
    stale = bits.view(torch.bfloat16)
    assert fingerprint(stale)[0] == fingerprint(x)[0]
    assert fingerprint(stale) != fingerprint(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sampled_fingerprint_reads_the_same_elements_on_both_sides_of_a_copy(dtype) -> None:
    """What ``weight_sync.check: sampled`` compares after a group's first sync: the learner's
    slice (a strided view of a row shard) and where the replica holds it (contiguous, or a
    region of a fused tensor) read in row-major order give the same sampled fingerprint."""
    from hybridflow.weights.transport.fingerprint import sampled_fingerprint

    shard = torch.randn(40, 3000, generator=torch.Generator().manual_seed(3)).to(dtype)
    sent = shard[:, 1000:2500]  # a TP slice of an FSDP row shard: strided
    fused = torch.zeros(100, 1500, dtype=dtype)
    fused[30:70].copy_(sent)  # the replica's region of a fused tensor
    for salt in (2, 3, 50):
        want = sampled_fingerprint(sent, 256, salt)
        assert sampled_fingerprint(fused[30:70], 256, salt) == want
        assert sampled_fingerprint(sent.contiguous().reshape(-1), 256, salt) == want
    # Small slices are read whole: the sampled fingerprint is the exact one.
    assert sampled_fingerprint(shard[:2, :100], 1024, 7) == fingerprint(shard[:2, :100])


def test_a_stale_slice_is_caught_by_the_sampled_fingerprint_when_its_elements_moved() -> None:
    """A slice left stale by a sync after an optimizer step that moved its elements (fp32
    Adam moves nearly every one) differs in the sampled elements; which elements are read
    moves from sync to sync (the salt)."""
    from hybridflow.weights.transport.fingerprint import sample_positions, sampled_fingerprint

    new = torch.randn(512, 512, generator=torch.Generator().manual_seed(4))
    stale = new - 1e-3 * torch.randn(512, 512, generator=torch.Generator().manual_seed(5))
    for salt in range(2, 6):
        assert sampled_fingerprint(stale, 1024, salt) != sampled_fingerprint(new, 1024, salt)
    first, second = sample_positions(new.numel(), 1024, 2), sample_positions(new.numel(), 1024, 3)
    assert len(first) == 1024 and not torch.equal(first, second)
    assert int(first.max()) < new.numel()


def test_positions_are_right_when_several_groups_sample_at_once() -> None:
    """A learner rank's replicas sync at once, one thread each, each group at its own sync
    number (the salt): the positions each thread gets are those of its own salt, whatever the
    others ask for meanwhile (the positions cached per slice size are shared)."""
    import threading

    from hybridflow.weights.transport.fingerprint import SAMPLE_RUN, sample_positions

    def expected(numel: int, salt: int) -> torch.Tensor:
        runs = 1024 // SAMPLE_RUN
        step = numel // runs
        starts = torch.arange(0, step * runs, step)
        spread = (starts[:, None] + torch.arange(SAMPLE_RUN)).reshape(-1)
        return spread + (salt * 7919) % (step - SAMPLE_RUN + 1)

    wrong: list[tuple[int, int]] = []

    def run(first_salt: int) -> None:
        for salt in range(first_salt, first_salt + 40):
            for numel in (5000, 70_000, 123_457):
                if not torch.equal(sample_positions(numel, 1024, salt), expected(numel, salt)):
                    wrong.append((numel, salt))

    threads = [threading.Thread(target=run, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slices_of_one_buffer_read_together_give_each_slice_its_own_sampled_fingerprint(
    dtype,
) -> None:
    """What a replica does with the slices same-host learner ranks wrote into its staging
    buffer (``sampled_fingerprints``: one gather for all the slices of one storage) gives, slice
    by slice, what the learner computes from its own tensors one at a time; a slice skipped in
    the buffer differs, and only that one."""
    from hybridflow.weights.transport.fingerprint import (
        sampled_fingerprint,
        sampled_fingerprints,
    )

    generator = torch.Generator().manual_seed(6)
    buffer = torch.randn(600_000, generator=generator).to(dtype)
    sizes = [1, 7, 1024, 1025, 1087, 100_000, 333_333, 5]  # read whole, and sampled
    views, offset = [], 0
    for size in sizes:
        views.append(buffer[offset : offset + size])
        offset += size + 3
    views.append(buffer[offset : offset + 600].view(20, 30))
    views.append(buffer[offset : offset + 600].view(20, 30)[:, :10])  # strided: alone
    views.append(torch.randn(4000, generator=generator).to(dtype))  # a storage of its own
    for salt in (0, 1, 2, 17, 123_456):
        want = [sampled_fingerprint(view, 1024, salt) for view in views]
        assert sampled_fingerprints(views, 1024, salt) == want
    # A second buffer with the same layout (a replica's two staging buffers) reuses the
    # positions and reads its own elements; the stale slice 6 is the one that differs.
    other = buffer.clone()
    other[sum(sizes[:6]) + 18 : sum(sizes[:6]) + 18 + sizes[6]] += 1
    moved = [other[v.storage_offset() : v.storage_offset() + v.numel()] for v in views[:8]]
    salt = 3
    got = sampled_fingerprints(moved, 1024, salt)
    want = sampled_fingerprints(views[:8], 1024, salt)
    assert [k for k in range(8) if got[k] != want[k]] == [6]
