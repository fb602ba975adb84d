"""The weight-sync benchmark's bookkeeping of the check's cost (``benchmarks/weight_sync/
report.py``): an alternating variant's syncs are read in pairs, each sampled sync against the
unchecked one just before it, so a slow stretch of the machine moves both alike."""

from __future__ import annotations

from typing import Any

from benchmarks.weight_sync.report import ratios, summarize
from benchmarks.weight_sync.spec import VariantSpec


def _rank(role: str, spans: list[float], alternating: bool) -> dict[str, Any]:
    starts, clock = [], 0.0
    for span in spans:
        starts.append(clock)
        clock += span + 1.0
    memory = {"maxrss_kib": 1024, "vmhwm_kib": 1024, "vmrss_kib": 512}
    return {
        "role": role, "starts": starts, "ends": [s + d for s, d in zip(starts, spans)],
        "bytes_sent": 4, "bytes_received": 4, "memory": memory, "memory_baseline": memory,
        "verified": True, "alternating": alternating,
    }  # fmt: skip


def test_an_alternating_variant_costs_the_median_of_its_sampled_over_unchecked_pairs() -> None:
    # The machine slows down halfway (0.1 s syncs, then 0.2 s): a check costing 10 % shows
    # as 10 % in every pair, whatever the drift.
    spans = [0.10, 0.11, 0.10, 0.11, 0.20, 0.22, 0.20, 0.22]
    reports = {0: _rank("source", spans, True), 1: _rank("destination", spans, True)}
    variant = summarize("shm", 1, reports)
    assert abs(variant["alternating"]["unchecked_seconds"] - 0.15) < 1e-9  # 0.1 0.1 0.2 0.2
    assert abs(variant["alternating"]["sampled_seconds"] - 0.165) < 1e-9
    cost = ratios({"shm_tp1_alternating": variant})["check_cost_sampled_alternating_shm_tp1"]
    assert abs(cost["value"] - 1.1) < 1e-9 and cost["met"] is True

    spans = [0.1, 0.15] * 2
    slower = summarize(
        "shm", 1, {0: _rank("source", spans, True), 1: _rank("destination", spans, True)}
    )
    cost = ratios({"shm_tp1_alternating": slower})["check_cost_sampled_alternating_shm_tp1"]
    assert abs(cost["value"] - 1.5) < 1e-9 and cost["met"] is False


def test_only_a_sampled_variant_alternates() -> None:
    base = dict(
        model="tiny", kind="shm", tp=1, num_src=2, bucket_bytes=4096, chunk_bytes=4096,
        num_warmup=1, num_syncs=4, raw_broadcast=False, timeout_s=10.0, store_port=0,
    )  # fmt: skip
    assert VariantSpec(**base, check_samples=1024, alternate=True).label == "shm_tp1_alternating"
    assert VariantSpec(**base, check_samples=1024).label == "shm_tp1_sampled"
    assert VariantSpec(**base, check=False).label == "shm_tp1_nocheck"
