"""The weight-sync benchmark end to end on the tiny model: every variant runs, checks and reports.

Runs ``benchmarks/weight_sync/run_weight_sync.py`` as a subprocess (21 spawned ranks in seven
process sets, 2 timed syncs each, then 2 log-prob parity syncs at TP 1) and checks the JSON against hand-computed byte counts.
Tiny model (vocab padded to 102): 102*64 + 2*(4*64*64 + 3*256*64 + 2*64) + 64 = 137,920
fp32 parameters = 551,680 bytes; at TP 2 every tensor but the 5 norms (320 floats) is split in
half: (137,920 - 320) / 2 + 320 = 69,120 floats = 276,480 bytes per destination rank.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.weight_sync.models import get_model, num_params, param_rows, topology_of

REPO = Path(__file__).resolve().parents[2]
MODEL_BYTES = 551_680
TP2_BYTES = 276_480
VARIANTS = {
    "planner_tp2", "shm_tp2", "naive_tp2", "planner_tp1", "shm_tp1", "naive_tp1", "grpc_tp1",
}  # fmt: skip


def test_param_rows_are_slices_of_the_full_tensor() -> None:
    full = param_rows(3, (10, 4), 0, 10)
    assert torch.equal(param_rows(3, (10, 4), 4, 7), full[4:7])
    # (3*7919 + 2*131 + 1*7) mod 1021 = 24026 mod 1021 = 543
    assert full[2, 1].item() == torch.tensor(543.0).div(1021.0).sub(0.5).item()
    assert num_params(topology_of(get_model("tiny"))) == MODEL_BYTES // 4
    assert num_params(topology_of(get_model("100m"))) == 100_449_920


@pytest.mark.slow  # ~50 s: the transports it times are tests of their own
def test_benchmark_runs_tiny_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [
        sys.executable, str(REPO / "benchmarks/weight_sync/run_weight_sync.py"),
        "--models", "tiny", "--syncs", "2", "--warmup", "1", "--timeout-s", "60",
        "--shm", "--parity-syncs", "2",
        "--results-dir", str(tmp_path / "results"), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "planner_over_naive_bytes_per_tp_rank_tp2" in done.stdout

    written = list((tmp_path / "results").glob("weight_sync_*.json"))
    assert len(written) == 1 and re.fullmatch(r"weight_sync_\d{8}_\d{6}\.json", written[0].name)
    result = json.loads(out.read_text())
    assert json.loads(written[0].read_text()) == result
    assert result["hardware"]["cpu_count"] >= 1 and result["hardware"]["cpu_model"]
    assert result["versions"]["torch"] == torch.__version__
    assert re.fullmatch(r"[0-9a-f]{40}", result["git"]["commit"])

    tiny = result["models"]["tiny"]
    assert tiny["model_bytes"] == MODEL_BYTES and tiny["num_params"] == MODEL_BYTES // 4
    v = tiny["variants"]
    assert set(v) == VARIANTS
    for label, variant in v.items():
        assert variant["verified"], label
        assert len(variant["seconds_all"]) == 2 and variant["seconds_per_sync"] > 0, label
        assert (
            variant["learner_rank0_peak_rss_mib"] >= variant["learner_rank0_rss_before_weights_mib"]
        ), label
    assert v["planner_tp2"]["bytes_received_per_dst_rank"] == [TP2_BYTES, TP2_BYTES]
    assert v["planner_tp2"]["bytes_sent_per_src_rank"] == [TP2_BYTES, TP2_BYTES]
    assert v["planner_tp1"]["bytes_received_per_dst_rank"] == [MODEL_BYTES]
    assert v["planner_tp1"]["bytes_sent_per_src_rank"] == [MODEL_BYTES // 2] * 2
    assert v["naive_tp2"]["bytes_received_per_dst_rank"] == [MODEL_BYTES, MODEL_BYTES]
    assert v["naive_tp2"]["bytes_sent_per_src_rank"] == [MODEL_BYTES, MODEL_BYTES // 2]
    assert v["grpc_tp1"]["bytes_received_per_dst_rank"] == [MODEL_BYTES]
    assert v["planner_tp2"]["raw_broadcast"]["num_bytes"] == TP2_BYTES
    assert v["planner_tp1"]["raw_broadcast"]["num_bytes"] == MODEL_BYTES
    assert v["planner_tp2"]["raw_broadcast"]["ok"]
    # Same bytes through shared memory as over the sockets; none shared when forced off.
    assert v["shm_tp2"]["bytes_received_per_dst_rank"] == [TP2_BYTES, TP2_BYTES]
    assert v["shm_tp2"]["bytes_shared_per_dst_rank"] == [TP2_BYTES, TP2_BYTES]
    assert v["shm_tp1"]["bytes_shared_per_dst_rank"] == [MODEL_BYTES]
    assert v["planner_tp1"]["bytes_shared_per_dst_rank"] == [0]
    for label in ("planner_tp1", "shm_tp1"):
        diffs = v[label]["logprob_max_abs_diff_per_sync"]
        assert len(diffs) == 2 and max(diffs) <= 1e-4, (label, diffs)

    r = tiny["ratios"]
    assert r["logprob_max_abs_diff_shm_tp1"]["met"] is True
    assert r["planner_over_naive_bytes_per_tp_rank_tp2"]["value"] == TP2_BYTES / MODEL_BYTES
    assert r["planner_over_naive_bytes_per_tp_rank_tp2"]["met"] is True
    assert r["planner_over_naive_bytes_per_tp_rank_tp1"]["value"] == 1.0
    for key in (
        "naive_over_planner_seconds_tp2",
        "grpc_over_planner_seconds_tp1",
        "planner_over_raw_bandwidth_tp2",
        "planner_over_raw_bandwidth_tp1",
        "planner_over_shm_seconds_tp1",
        "planner_over_shm_seconds_tp2",
    ):
        assert r[key]["value"] > 0 and isinstance(r[key]["met"], bool), key
