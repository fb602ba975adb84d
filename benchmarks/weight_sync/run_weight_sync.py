"""Weight-sync benchmark: planner vs naive over gloo, gRPC streaming, and a raw broadcast ceiling.

For each model (``--models``), in one invocation, each variant in a fresh set of spawned
processes (so peak RSS never mixes):

- ``planner_tpT``: W learner ranks (FSDP dim-0 shards) -> one replica of TP T with
  ``DistExecutor``; then, in the same group, a raw gloo broadcast of the bytes one destination
  rank received (the ceiling);
- ``shm_tpT`` (``--shm``): the planner with same-host pairs through POSIX shared memory
  (``weight_sync.shared_memory: auto``; ``planner_tpT`` forces the gloo sockets);
- ``naive_tpT``: the same group with ``NaiveExecutor`` (gather on rank 0, broadcast full tensors);
- ``grpc_tp1``: learner rank 0 streams full tensors to one receiver over loopback gRPC
  (``UpdateWeights``: ``iter_weight_chunks`` -> ``receive_weights``).

With ``--parity-syncs N`` the TP-1 planner and shm variants then run N untimed syncs of
changed weights and compare a fixed batch's log-probs on the destination with the learner's.
Reported per variant: median seconds per sync over ``--syncs`` after ``--warmup``, bytes per
destination and source rank, effective bandwidth, learner rank 0's peak RSS; per model the target
ratios. Prints a table; writes JSON (hardware, versions, git commit) to
``results/weight_sync_YYYYMMDD_HHMMSS.json`` and to ``--out`` if given.

    PYTHONPATH=. python benchmarks/weight_sync/run_weight_sync.py --models tiny,100m --syncs 5

With ``--check-cost`` each planner/shm/naive variant is followed by its twin with the
delivery check (slice fingerprints, on by default in the services) off: ``..._nocheck``,
and each planner/shm variant by one whose check after the first sync samples
``CHECK_SAMPLES`` elements of each slice (``weight_sync.check: sampled``): ``..._sampled``,
and one whose timed syncs alternate unchecked and sampled in one process set:
``..._alternating``, its cost the median of each sampled sync over the unchecked one before it
(two process sets of one variant differ by up to 20 % on the 2-core machine).

Models: ``tiny`` (the built-in model's shapes), ``small`` (7.3M), ``100m`` (100,449,920 fp32
parameters), ``0.5b`` (Qwen2.5-0.5B's dims, 494M, TP 1), ``qwen3-100m`` (Qwen3-shaped: q/k norms, grouped-query attention, tied head;
100,094,208; no ``--parity-syncs``: the parity model is a Llama). Every spawned rank sets ``torch.set_num_threads(1)``; store and gloo ports come
from the OS; only this script's own children are ever killed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.weight_sync.spec import VariantSpec  # noqa: E402 (after the path fix)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default="tiny,100m", help="comma list: tiny, small, 100m, qwen3-100m"
    )
    parser.add_argument("--tp", default="2,1", help="comma list of destination TP sizes")
    parser.add_argument("--num-src", type=int, default=2, help="learner (source) ranks")
    parser.add_argument("--syncs", type=int, default=5, help="timed syncs per variant")
    parser.add_argument("--warmup", type=int, default=1, help="untimed syncs first")
    parser.add_argument("--bucket-mib", type=float, default=None, help="plan bucket size (MiB)")
    parser.add_argument("--chunk-kib", type=int, default=None, help="gRPC chunk size (KiB)")
    parser.add_argument("--no-grpc", action="store_true", help="skip the gRPC variant")
    parser.add_argument(
        "--shm", action="store_true", help="add shm_tpT: same-host pairs via shared memory"
    )
    parser.add_argument(
        "--kinds",
        default=None,
        help="comma list of planner, shm, naive (default: planner,naive and shm with --shm)",
    )
    parser.add_argument(
        "--check-cost", action="store_true",
        help="after each planner/shm/naive variant, the same with the delivery check off",
    )  # fmt: skip
    parser.add_argument(
        "--check-samples", type=int, default=0,
        help="elements a sampled check reads per slice (default: weight_sync's CHECK_SAMPLES)",
    )  # fmt: skip
    parser.add_argument(
        "--parity-syncs", type=int, default=0, help="TP-1 log-prob parity syncs after timing"
    )
    parser.add_argument("--timeout-s", type=float, default=300.0, help="deadline per variant")
    parser.add_argument("--results-dir", type=Path, default=REPO / "results")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.tp_sizes = [int(t) for t in args.tp.split(",") if t]
    args.model_names = [m for m in args.models.split(",") if m]
    if not args.model_names:
        parser.error("--models: need at least one model")
    if any(t < 1 for t in args.tp_sizes) or args.num_src < 1:
        parser.error("--tp / --num-src: need sizes >= 1")
    if args.kinds and not set(args.kinds.split(",")) <= {"planner", "shm", "naive"}:
        parser.error("--kinds: choose from planner, shm, naive")
    if args.parity_syncs < 0:
        parser.error("--parity-syncs: need >= 0")
    if args.syncs < 1 or args.warmup < 0:
        parser.error("--syncs: need >= 1 (and --warmup >= 0)")
    return args


def run_variant(spec: VariantSpec) -> dict[int, dict[str, Any]]:
    """Spawn the variant's ranks around a fresh TCPStore; return each rank's report."""
    import dataclasses
    import datetime
    import queue

    import torch.distributed as dist
    import torch.multiprocessing as mp

    from benchmarks.weight_sync.dist_worker import run_rank
    from benchmarks.weight_sync.grpc_worker import run_grpc_rank

    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = dist.TCPStore(
        "127.0.0.1", 0, None, is_master=True, timeout=timeout, wait_for_workers=False
    )
    spec = dataclasses.replace(spec, store_port=store.port)
    target = run_grpc_rank if spec.kind == "grpc" else run_rank
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(spec, r, results), daemon=True)
        for r in range(spec.world_size)
    ]
    deadline = time.monotonic() + spec.timeout_s
    reports: dict[int, dict[str, Any]] = {}
    try:
        for p in procs:
            p.start()
        while len(reports) < len(procs):
            try:
                rank, report = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                missing = sorted(set(range(len(procs))) - set(reports))
                raise RuntimeError(f"{spec.label}: ranks {missing} timed out") from None
            if "error" in report:
                raise RuntimeError(f"{spec.model} {spec.label} rank {rank}:\n{report['error']}")
            reports[rank] = report
        for p in procs:
            p.join(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        for p in procs:  # only this variant's own children
            if p.is_alive():
                p.kill()
                p.join()
    return reports


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.weight_sync.models import get_model, num_params, topology_of
    from benchmarks.weight_sync.report import ratios, summarize
    from hybridflow.resharding.plan import make_plan
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.weights.config import WeightSyncConfig

    model = get_model(name)
    if args.parity_syncs and model.layout.qk_norm:
        raise SystemExit(f"--parity-syncs checks a Llama; {name} has q/k norms (use 0)")
    topology = topology_of(model)
    bucket = int(args.bucket_mib * 2**20) if args.bucket_mib else WeightSyncConfig().bucket_bytes
    chunk = args.chunk_kib * 1024 if args.chunk_kib else ChannelConfig().chunk_bytes

    def spec(
        kind: str, tp: int, check: bool = True, samples: int = 0, alternate: bool = False
    ) -> VariantSpec:
        return VariantSpec(
            model=name, kind=kind, tp=tp, num_src=args.num_src, bucket_bytes=bucket,  # type: ignore[arg-type]
            chunk_bytes=chunk, num_warmup=args.warmup, num_syncs=args.syncs,
            raw_broadcast=kind == "planner", timeout_s=args.timeout_s, store_port=0,
            parity_syncs=args.parity_syncs if kind in ("planner", "shm") and check else 0,
            check=check, check_samples=samples, alternate=alternate,
        )  # fmt: skip

    for tp in args.tp_sizes:  # a shape the planner cannot split fails here, before spawning
        make_plan(topology, args.num_src, [tp], bucket)
    kinds = ("planner", "shm", "naive") if args.shm else ("planner", "naive")
    if args.kinds:
        kinds = tuple(k for k in args.kinds.split(",") if k)
    from hybridflow.weights.config import CHECK_SAMPLES

    checks = ((True, 0), (False, 0)) if args.check_cost else ((True, 0),)
    specs = [spec(kind, tp, c, n) for tp in args.tp_sizes for kind in kinds for c, n in checks]
    if args.check_cost:
        specs += [
            spec(kind, tp, True, args.check_samples or CHECK_SAMPLES, alternate)
            for tp in args.tp_sizes
            for kind in kinds
            if kind in ("planner", "shm")
            for alternate in (False, True)
        ]
    if not args.no_grpc:
        specs.append(spec("grpc", 1))
    variants = {}
    for s in specs:
        start = time.perf_counter()
        variants[s.label] = summarize(s.kind, s.tp, run_variant(s))
        variants[s.label]["wall_s"] = time.perf_counter() - start
        print(f"  {name} {s.label}: {variants[s.label]['seconds_per_sync']:.4f} s/sync", flush=True)
    return {
        "dims": model.dims.__dict__,
        "note": model.note,
        "num_params": num_params(topology),
        "model_bytes": topology.num_bytes,
        "num_src_ranks": args.num_src,
        "bucket_bytes": bucket,
        "grpc_chunk_bytes": chunk,
        "variants": variants,
        "ratios": ratios(variants),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    # The gRPC variant's UpdateWeights changes state: its server and client share a token
    # (spawned ranks inherit it), as the services do.
    os.environ.setdefault("HYBRIDFLOW_TOKEN", secrets.token_hex(16))

    from benchmarks.weight_sync.models import get_model
    from benchmarks.weight_sync.report import TARGETS, environment, table

    torch.set_num_threads(1)
    for name in args.model_names:
        get_model(name)
    started = time.strftime("%Y%m%d_%H%M%S")
    start = time.perf_counter()
    results: dict[str, Any] = {
        "benchmark": "weight_sync",
        "started": started,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "targets": TARGETS,
        "timing": "per sync: latest end - earliest start over all ranks (CLOCK_MONOTONIC); "
        "median over timed syncs; grpc: sender call -> reply",
        "sources": "FSDP2 dim-0 rows (fsdp_dim0_rows, the rule fully_shard uses), built "
        "per rank without materialising the full model; gRPC sender holds full tensors "
        "(its all-gather is not timed)",
        **environment(REPO),
        "models": {},
    }
    for name in args.model_names:
        print(f"model {name}", flush=True)
        results["models"][name] = run_model(name, args)
    results["total_wall_s"] = time.perf_counter() - start

    results["loadavg_end"] = list(os.getloadavg())
    print(table(results))
    print(f"total {results['total_wall_s']:.1f} s")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    paths = [args.results_dir / f"weight_sync_{started}.json"]
    if args.out:
        paths.append(args.out)
    for path in paths:
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
