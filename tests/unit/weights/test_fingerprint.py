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
