"""Turn per-rank reports into per-variant numbers, the target ratios, a table and the run's context.

Pure bookkeeping over the dicts the workers return; no torch, no processes.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

MIB = 2**20
TARGETS = {
    "planner_over_naive_bytes_per_tp_rank": "== 1/TP",
    "naive_over_planner_seconds_tp2": ">= 2",
    "grpc_over_planner_seconds_tp1": ">= 5",
    "planner_over_raw_bandwidth": ">= 0.7",
    "planner_over_shm_seconds": ">= 2 (same host)",
    "logprob_max_abs_diff": "<= 1e-4 after every sync",
}


def span_seconds(timed: list[dict[str, Any]]) -> list[float]:
    """Per timed sync: latest end minus earliest start over the ranks that timed it."""
    num = len(timed[0]["starts"])
    return [
        max(r["ends"][i] for r in timed) - min(r["starts"][i] for r in timed) for i in range(num)
    ]


def summarize(kind: str, tp: int, reports: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One variant's numbers from its ranks' reports."""
    ranks = [reports[r] for r in sorted(reports)]
    sources = [r for r in ranks if r["role"] in ("source", "sender")]
    dests = [r for r in ranks if r["role"] in ("destination", "receiver")]
    seconds = span_seconds([r for r in ranks if "starts" in r])
    median = statistics.median(seconds)
    received = [int(r["bytes_received"]) for r in dests]
    rank0 = reports[0]
    out: dict[str, Any] = {
        "kind": kind,
        "tp": tp,
        "seconds_per_sync": median,
        "seconds_all": seconds,
        "bytes_received_per_dst_rank": received,
        "bytes_sent_per_src_rank": [int(r["bytes_sent"]) for r in sources],
        "effective_gb_per_s_per_dst_rank": max(received) / median / 1e9,
        "aggregate_gb_per_s": sum(received) / median / 1e9,
        "learner_rank0_peak_rss_mib": rank0["memory"]["maxrss_kib"] / 1024,
        "learner_rank0_vmhwm_mib": rank0["memory"]["vmhwm_kib"] / 1024,
        "learner_rank0_rss_before_weights_mib": rank0["memory_baseline"]["vmrss_kib"] / 1024,
        "dst_peak_rss_mib": [r["memory"]["maxrss_kib"] / 1024 for r in dests],
        "verified": all(bool(r.get("verified")) for r in dests),
    }
    if rank0.get("alternating"):  # even syncs unchecked, odd ones sampled (spec.alternate)
        pairs = [checked / plain for plain, checked in zip(seconds[0::2], seconds[1::2])]
        out["alternating"] = {
            "unchecked_seconds": statistics.median(seconds[0::2]),
            "sampled_seconds": statistics.median(seconds[1::2]),
            "paired_ratios": pairs,
        }
    if any("bytes_shared" in r for r in dests):
        out["bytes_shared_per_dst_rank"] = [int(r["bytes_shared"]) for r in dests]
    if any("logprob_max_abs_diff" in r for r in dests):
        out["logprob_max_abs_diff_per_sync"] = [r["logprob_max_abs_diff"] for r in dests][0]
    if "num_buckets" in rank0:
        out["num_buckets"] = rank0["num_buckets"]
        out["messages_per_rank"] = [int(r["num_messages"]) for r in ranks]
    if "raw" in rank0:
        raw_seconds = span_seconds([r["raw"] for r in ranks])
        raw_median = statistics.median(raw_seconds)
        num_bytes = rank0["raw"]["num_bytes"]
        out["raw_broadcast"] = {
            "num_bytes": num_bytes,
            "seconds_per_sync": raw_median,
            "seconds_all": raw_seconds,
            "gb_per_s": num_bytes / raw_median / 1e9,
            "ok": all(r["raw"]["ok"] for r in ranks),
        }
    return out


def ratios(variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The target ratios for one model, from whichever variants ran (missing ones: None)."""
    out: dict[str, Any] = {}
    for tp in sorted({v["tp"] for v in variants.values() if v["kind"] != "grpc"}):
        planner, naive = variants.get(f"planner_tp{tp}"), variants.get(f"naive_tp{tp}")
        if planner and naive:
            got = max(planner["bytes_received_per_dst_rank"]) / max(
                naive["bytes_received_per_dst_rank"]
            )
            out[f"planner_over_naive_bytes_per_tp_rank_tp{tp}"] = {
                "value": got, "target": 1 / tp, "met": got <= 1 / tp * 1.05,
            }  # fmt: skip
            speed = naive["seconds_per_sync"] / planner["seconds_per_sync"]
            out[f"naive_over_planner_seconds_tp{tp}"] = {
                "value": speed, "target": 2.0 if tp == 2 else None,
                "met": speed >= 2.0 if tp == 2 else None,
            }  # fmt: skip
        shm = variants.get(f"shm_tp{tp}")
        if planner and shm:
            speed = planner["seconds_per_sync"] / shm["seconds_per_sync"]
            out[f"planner_over_shm_seconds_tp{tp}"] = {
                "value": speed, "target": 2.0, "met": speed >= 2.0,
            }  # fmt: skip
        for kind in ("planner", "shm", "naive"):  # --check-cost: checked over unchecked
            checked, unchecked = (
                variants.get(f"{kind}_tp{tp}"),
                variants.get(f"{kind}_tp{tp}_nocheck"),
            )
            if checked and unchecked:
                cost = checked["seconds_per_sync"] / unchecked["seconds_per_sync"]
                out[f"check_cost_{kind}_tp{tp}"] = {"value": cost, "target": None, "met": None}
            sampled = variants.get(f"{kind}_tp{tp}_sampled")
            if sampled and unchecked:
                cost = sampled["seconds_per_sync"] / unchecked["seconds_per_sync"]
                out[f"check_cost_sampled_{kind}_tp{tp}"] = {
                    "value": cost, "target": 1.1, "met": cost <= 1.1,
                }  # fmt: skip
            alternating = variants.get(f"{kind}_tp{tp}_alternating", {}).get("alternating")
            if alternating:  # each sampled sync over the unchecked one before it: the median
                cost = statistics.median(alternating["paired_ratios"])
                out[f"check_cost_sampled_alternating_{kind}_tp{tp}"] = {
                    "value": cost, "target": 1.1, "met": cost <= 1.1,
                }  # fmt: skip
        for label in (f"planner_tp{tp}", f"shm_tp{tp}"):
            diffs = variants.get(label, {}).get("logprob_max_abs_diff_per_sync")
            if diffs:
                out[f"logprob_max_abs_diff_{label}"] = {
                    "value": max(diffs), "target": 1e-4, "met": max(diffs) <= 1e-4,
                }  # fmt: skip
        if planner and "raw_broadcast" in planner:
            bw = planner["effective_gb_per_s_per_dst_rank"] / planner["raw_broadcast"]["gb_per_s"]
            out[f"planner_over_raw_bandwidth_tp{tp}"] = {
                "value": bw, "target": 0.7, "met": bw >= 0.7,
            }  # fmt: skip
    grpc, planner1 = variants.get("grpc_tp1"), variants.get("planner_tp1")
    if grpc and planner1:
        slow = grpc["seconds_per_sync"] / planner1["seconds_per_sync"]
        out["grpc_over_planner_seconds_tp1"] = {"value": slow, "target": 5.0, "met": slow >= 5.0}
    return out


def table(results: dict[str, Any]) -> str:
    """A fixed-width table of every variant of every model, then the ratios."""
    head = (
        f"{'model':6} {'variant':11} {'s/sync':>8} {'MiB rx/dst':>10} {'MiB tx/src':>10} "
        f"{'GB/s/dst':>8} {'rank0 RSS MiB':>13} {'ok':>3}"
    )
    lines = [head, "-" * len(head)]
    for name, model in results["models"].items():
        for label, v in model["variants"].items():
            rss = f"{v['learner_rank0_peak_rss_mib']:.0f}"
            lines.append(
                f"{name:6} {label:11} {v['seconds_per_sync']:8.4f} "
                f"{max(v['bytes_received_per_dst_rank']) / MIB:10.2f} "
                f"{max(v['bytes_sent_per_src_rank']) / MIB:10.2f} "
                f"{v['effective_gb_per_s_per_dst_rank']:8.3f} {rss:>13} "
                f"{'yes' if v['verified'] else 'NO':>3}"
            )
            raw = v.get("raw_broadcast")
            if raw:
                lines.append(
                    f"{name:6} {'raw_bc_tp' + str(v['tp']):11} {raw['seconds_per_sync']:8.4f} "
                    f"{raw['num_bytes'] / MIB:10.2f} {raw['num_bytes'] / MIB:10.2f} "
                    f"{raw['gb_per_s']:8.3f} {'-':>13} {'yes' if raw['ok'] else 'NO':>3}"
                )
    lines.append("")
    for name, model in results["models"].items():
        for key, r in model["ratios"].items():
            target = "" if r["target"] is None else f"target {r['target']:.3g}, "
            met = {True: "met", False: "NOT met", None: "info"}[r["met"]]
            lines.append(f"{name:6} {key:44} {r['value']:8.3f}  ({target}{met})")
    return "\n".join(lines)


def environment(repo: Path) -> dict[str, Any]:
    """Hardware, versions, git commit and load (the machine may be shared)."""
    import grpc
    import numpy
    import torch
    from google import protobuf

    cpu = platform.processor()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else f"unavailable: {done.stderr}"

    return {
        "hardware": {
            "cpu_model": cpu,
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "machine": platform.machine(),
            "mem_total_kib": _meminfo_total_kib(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "grpcio": grpc.__version__,
            "protobuf": protobuf.__version__,
            "numpy": numpy.__version__,
            "platform": platform.platform(),
        },
        "git": {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))},
        "loadavg_start": list(os.getloadavg()),
    }


def _meminfo_total_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return -1
