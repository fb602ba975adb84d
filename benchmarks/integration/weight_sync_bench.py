"""Weight sync: the planned torch.distributed executor against a raw broadcast of the same bytes.

Reuses benchmarks/weight_sync/ (``run_variant`` spawns the learner source ranks and the
replica's TP ranks around a TCPStore; ``summarize`` turns their reports into seconds per sync):
``planner`` (DistExecutor, then a raw gloo broadcast of the bytes one destination received, in
the same group) and ``naive`` (gather to rank 0 and broadcast: "planner off").
Knows that package's entry points; nothing of services.
"""

from __future__ import annotations

from typing import Any

from benchmarks.integration.config import WeightSyncBench
from benchmarks.integration.timing import DetailedLog

MIB = 2**20


def run(cfg: WeightSyncBench, log: DetailedLog) -> dict[str, Any]:
    from benchmarks.weight_sync.report import summarize
    from benchmarks.weight_sync.run_weight_sync import run_variant
    from benchmarks.weight_sync.spec import VariantSpec
    from hybridflow.rpc.config import ChannelConfig

    out: dict[str, Any] = {"model": cfg.model, "num_src_ranks": cfg.num_src, "tp": cfg.tp}
    for kind in ("planner", "naive"):
        spec = VariantSpec(
            model=cfg.model, kind=kind, tp=cfg.tp, num_src=cfg.num_src,
            bucket_bytes=int(cfg.bucket_mib * MIB), chunk_bytes=ChannelConfig().chunk_bytes,
            num_warmup=cfg.warmup, num_syncs=cfg.repeats, raw_broadcast=kind == "planner",
            timeout_s=cfg.timeout_s, store_port=0,
        )  # fmt: skip
        summary = summarize(kind, cfg.tp, run_variant(spec))
        nbytes = max(summary["bytes_received_per_dst_rank"])
        for i, sec in enumerate(summary["seconds_all"]):
            log.add("weight_sync", kind, sec, repeat=i, bytes_per_dst=nbytes)
        out[kind] = summary
        raw = summary.get("raw_broadcast")
        if raw:
            for i, sec in enumerate(raw["seconds_all"]):
                log.add("weight_sync", "raw_broadcast", sec, repeat=i, bytes=raw["num_bytes"])
    planner, naive = out["planner"], out["naive"]
    raw = planner.get("raw_broadcast", {})
    out["verified"] = bool(planner["verified"] and naive["verified"])
    out["planner_mb_per_s"] = planner["effective_gb_per_s_per_dst_rank"] * 1e3
    out["raw_broadcast_mb_per_s"] = raw.get("gb_per_s", 0.0) * 1e3
    out["planner_over_raw_bandwidth"] = (
        planner["effective_gb_per_s_per_dst_rank"] / raw["gb_per_s"] if raw else None
    )
    out["naive_over_planner_seconds"] = naive["seconds_per_sync"] / planner["seconds_per_sync"]
    return out
