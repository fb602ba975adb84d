"""Weight-sync seconds at 7B-1T, predicted from the planner's own plan (``hybridflow.resharding.
simulate``), and the link model calibrated on what this machine measures.

For each (model, learner GPUs, replicas x TP) row the planner computes the real plan (as the
learner does at a job's first sync: bf16, 256 MiB buckets unless ``--bucket-mib``), and
``predict`` reads it on an HGX H100 node's links: NVLink 4 at 450 GB/s per GPU and direction
(900 GB/s both ways, NVIDIA's H100 SXM datasheet), one ConnectX-7 card per GPU at 400 Gb/s =
50 GB/s per direction (the DGX H100 layout), 20 microseconds per point-to-point send
(assumed: an NCCL send/recv's launch and handshake; it weighs only where buckets are many).
The models are the published shapes (``MODELS``); the 1T MoE has Kimi K2's experts and
depth with grouped-query attention in place of its MLA (the planner has no MLA layout;
attention is under 2 % of its bytes), in fp8 (its block scales left out); the others bf16. Published figures are the issue's (#44) quotes: a
235B MoE in 3.2-3.3 s (vLLM's sharded path), a 1T MoE in 7 s (miles), 30B-A3B in 0.74-1.0 s
(NeMo-RL), each with its engine's reload, which the prediction leaves out, on a layout
the table's row only approximates.

``--calibrate RESULTS.json`` (from ``benchmarks/weight_sync/run_weight_sync.py``) fits the
same model to this machine instead: one node, every rank a process, the planner's gloo
sends over loopback; it fits the per-rank bandwidth and the per-send latency to the
measured planner syncs (least squares on the two terms) and prints each measurement beside
its prediction and the relative error.

    python benchmarks/weight_sync/simulate_scale.py [--out table.json]
    python benchmarks/weight_sync/simulate_scale.py --calibrate results/weight_sync_X.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hybridflow.models.families import DecoderDims, DecoderLayout  # noqa: E402
from hybridflow.models.families.decoder import decoder_topology  # noqa: E402
from hybridflow.resharding.plan import make_plan  # noqa: E402
from hybridflow.resharding.simulate import LinkModel, predict  # noqa: E402

GB = 1e9
INF = float("inf")
H100 = LinkModel(
    name="HGX H100 (NVLink 4, ConnectX-7 per GPU)",
    gpus_per_node=8,
    intra_bw=450 * GB,
    inter_bw=50 * GB,
    latency_s=20e-6,
    source="NVIDIA H100 SXM datasheet (NVLink 900 GB/s bidirectional per GPU); DGX H100 "
    "(8x ConnectX-7 400 Gb/s, NVSwitch 7.2 TB/s in all); latency assumed",
    node_bw=3600 * GB,  # 7.2 TB/s counts both directions
)

QWEN3 = DecoderLayout(qk_norm=True)
MODELS: dict[str, tuple[DecoderDims, DecoderLayout | None]] = {
    # Qwen2.5-7B (config.json)
    "7B dense": (DecoderDims(3584, 18944, 28, 4, 128, 152064, 28), None),
    # Llama-3-70B
    "70B dense": (DecoderDims(8192, 28672, 64, 8, 128, 128256, 80), None),
    # Qwen3-30B-A3B: 48 layers, 128 experts of 768
    "30B-A3B MoE": (
        DecoderDims(2048, 6144, 32, 4, 128, 151936, 48, num_experts=128, moe_intermediate=768,
                    moe_layers=tuple(range(48))),
        QWEN3,
    ),
    # Qwen3-235B-A22B: 94 layers, 128 experts of 1536
    "235B-A22B MoE": (
        DecoderDims(4096, 12288, 64, 4, 128, 151936, 94, num_experts=128,
                    moe_intermediate=1536, moe_layers=tuple(range(94))),
        QWEN3,
    ),
    # Kimi K2's experts (384 of 2048, 61 layers, the first dense), GQA attention, in fp8 as
    # it is released (1 TB: a TP-16 replica of 80 GB GPUs holds it; bf16 would not fit)
    "1T MoE": (
        DecoderDims(7168, 18432, 64, 8, 128, 163840, 61, dtype="float8_e4m3fn",
                    num_experts=384, moe_intermediate=2048, moe_layers=tuple(range(1, 61))),
        None,
    ),
}  # fmt: skip

ROWS: list[tuple[str, int, tuple[int, ...], str]] = [
    ("7B dense", 8, (1,) * 8, ""),
    ("7B dense", 8, (2,) * 4, ""),
    ("70B dense", 64, (8,) * 8, ""),
    ("30B-A3B MoE", 16, (8,) * 2, "0.74-1.0 s (NeMo-RL)"),
    ("235B-A22B MoE", 64, (8,) * 8, "3.2-3.3 s (vLLM sharded path)"),
    ("1T MoE", 64, (16,) * 4, "7 s (miles)"),
]
"""(model, learner GPUs, each replica's TP, published figure)."""


def scale_table(bucket_bytes: int) -> list[dict[str, Any]]:
    rows = []
    for model, num_src, replicas, published in ROWS:
        dims, layout = MODELS[model]
        topology = decoder_topology(dims, layout, fused=True)
        start = time.perf_counter()
        plan = make_plan(topology, num_src, replicas, bucket_bytes)
        planned_s = time.perf_counter() - start
        p = predict(plan, H100)
        rows.append({
            "model": model, "params": sum(_numel(s.shape) for s in topology.params),
            "learner_gpus": num_src, "replicas": len(replicas), "tp": replicas[0],
            "predicted_s": p.seconds, "wire_s": p.wire_seconds, "latency_s": p.latency_seconds,
            "bottleneck": p.bottleneck, "max_gpu_ingress_gb": p.max_gpu_ingress_bytes / GB,
            "max_gpu_egress_gb": p.max_gpu_egress_bytes / GB,
            "inter_node_gb": p.inter_node_bytes / GB, "buckets_max_per_gpu": p.max_buckets_per_gpu,
            "nodes": p.num_nodes, "published": published, "planning_s": planned_s,
        })  # fmt: skip
        r = rows[-1]
        print(f"{model:14s} {num_src:4d} learner GPUs -> {len(replicas):3d} x TP{replicas[0]:<3d}"
              f" {r['predicted_s']:7.3f} s  ({r['bottleneck']}; {r['max_gpu_ingress_gb']:.1f} GB"
              f" into the busiest GPU; planned in {planned_s:.1f} s)  {published}", flush=True)  # fmt: skip
    return rows


def calibrate(results_path: Path) -> dict[str, Any]:
    """Fits this machine's per-rank bandwidth and per-send latency to the measured planner
    syncs of a weight_sync run; each point with its prediction."""
    import numpy as np

    from benchmarks.weight_sync.models import get_model, topology_of

    results = json.loads(results_path.read_text())
    points = []
    for name, model in results["models"].items():
        topology = topology_of(get_model(name))
        unchecked = any(label.endswith("_nocheck") for label in model["variants"])
        for label, variant in model["variants"].items():
            # the wire alone where the run measured it (--check-cost: the delivery check's
            # fingerprints are compute, not a link)
            if variant["kind"] != "planner" or label.endswith("_nocheck") != unchecked:
                continue
            plan = make_plan(
                topology, model["num_src_ranks"], [variant["tp"]], model["bucket_bytes"]
            )
            # one node, its loopback the shared link: wire term in bytes, latency in sends
            unit = LinkModel("unit", plan.world_size, INF, INF, 1.0, "", node_bw=1.0)
            p = predict(plan, unit)
            points.append(
                (name, label, p.wire_seconds, p.latency_seconds, variant["seconds_per_sync"])
            )
    x = np.array([[w, n] for _, _, w, n, _ in points])
    y = np.array([s for *_, s in points])
    inv_bw, latency = _fit_relative(x, y)
    fitted = []
    for (name, label, _, _, measured), pred in zip(points, x @ [inv_bw, latency], strict=True):
        fitted.append({"model": name, "variant": label, "measured_s": measured,
                       "predicted_s": float(pred), "error": float(pred / measured - 1)})  # fmt: skip
        print(
            f"{name:10s} {label:12s} measured {measured:8.4f} s  predicted {pred:8.4f} s  "
            f"({pred / measured - 1:+.0%})"
        )
    print(
        f"this machine: {1 / inv_bw / GB:.2f} GB/s through its loopback in all, "
        f"{latency * 1e3:.3f} ms per send"
    )
    return {"node_gb_per_s": 1 / inv_bw / GB, "latency_s": float(latency), "points": fitted}


def _fit_relative(x: Any, y: Any) -> tuple[float, float]:
    """Non-negative (seconds per byte, seconds per send) minimising the squared relative
    errors (a small model's 2 ms counts as much as a large one's 200 ms)."""
    import numpy as np

    w = x / y[:, None]
    best: tuple[float, float, float] | None = None
    for cols in ([0, 1], [0], [1]):
        coef, *_ = np.linalg.lstsq(w[:, cols], np.ones(len(y)), rcond=None)
        full = np.zeros(2)
        full[cols] = coef
        if (full < 0).any():
            continue
        err = float(np.sum((w @ full - 1) ** 2))
        if best is None or err < best[0]:
            best = (err, float(full[0]), float(full[1]))
    assert best is not None
    return best[1], best[2]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bucket-mib", type=float, default=256.0)
    parser.add_argument("--calibrate", type=Path, help="a weight_sync results JSON")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.calibrate:
        out: Any = calibrate(args.calibrate)
    else:
        out = {"links": H100.__dict__, "rows": scale_table(int(args.bucket_mib * 2**20))}
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
