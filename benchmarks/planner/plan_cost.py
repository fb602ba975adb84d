"""Planning cost of the resharding planner on a 70B-class Llama (numpy only, no torch).

Default: 80 layers, hidden 8192, intermediate 28672, 64 heads, 8 KV heads, head dim 128,
vocab 128256, bf16, fused qkv/gate_up; FSDP over 64 learner ranks -> 8 replicas of TP 8.
Prints (and with ``--out`` writes as JSON) planning and hashing seconds, the number of transfers
and buckets, and bytes per destination rank against the naive executor (full model each).

    python benchmarks/planner/plan_cost.py [--num-src 64] [--tp 8] [--replicas 8]
        [--bucket-mib 256] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-src", type=int, default=64, help="FSDP learner ranks")
    parser.add_argument("--tp", type=int, default=8, help="TP size of each replica")
    parser.add_argument("--replicas", type=int, default=8, help="number of replicas")
    parser.add_argument("--bucket-mib", type=float, default=256.0, help="bucket size in MiB")
    parser.add_argument("--layers", type=int, default=80, help="decoder layers")
    parser.add_argument("--out", type=Path, default=None, help="write results JSON here")
    args = parser.parse_args()

    import numpy as np

    from hybridflow.models.families import DecoderDims
    from hybridflow.models.families.decoder import decoder_topology
    from hybridflow.resharding.plan import make_plan

    dims = DecoderDims(
        hidden=8192, intermediate=28672, num_heads=64, num_kv_heads=8, head_dim=128,
        vocab=128256, num_layers=args.layers, tie_embeddings=False, dtype="bfloat16",
    )  # fmt: skip
    start = time.perf_counter()
    topology = decoder_topology(dims, fused=True)
    replicas = [args.tp] * args.replicas
    plan = make_plan(topology, args.num_src, replicas, int(args.bucket_mib * 2**20))
    plan_s = time.perf_counter() - start
    start = time.perf_counter()
    digest = plan.content_hash()
    hash_s = time.perf_counter() - start

    received = [plan.bytes_received(r, t) for r in range(args.replicas) for t in range(args.tp)]
    sent = np.bincount(plan.columns["src_rank"], weights=plan.columns["nbytes"])
    buckets = plan.bucket_columns["nbytes"]
    result = {
        "model": {"num_params": topology.num_bytes // 2, "model_bytes": topology.num_bytes},
        "num_src_ranks": args.num_src,
        "replicas": replicas,
        "bucket_bytes": plan.bucket_bytes,
        "plan_seconds": round(plan_s, 3),
        "hash_seconds": round(hash_s, 3),
        "num_transfers": plan.num_transfers,
        "num_buckets": plan.num_buckets,
        "max_bucket_bytes": int(buckets.max()),
        "mean_bucket_bytes": float(buckets.mean()),
        "bytes_per_dst_rank_max": max(received),
        "bytes_per_dst_rank_min": min(received),
        "naive_bytes_per_dst_rank": topology.num_bytes,
        "bytes_per_src_rank_max": int(sent.max()),
        "content_hash": digest,
        "hardware": {"machine": platform.machine(), "processor": platform.processor()},
        "versions": {"python": platform.python_version(), "numpy": np.__version__},
    }
    gib = 2**30
    print(
        f"planned {plan.num_transfers} transfers in {plan.num_buckets} buckets in {plan_s:.2f} s "
        f"(hash {hash_s:.2f} s)\n"
        f"bytes per destination rank: {max(received) / gib:.2f} GiB planned vs "
        f"{topology.num_bytes / gib:.2f} GiB naive ({topology.num_bytes / max(received):.1f}x less)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
