"""Overload benchmark: a rollout service under twice the load it can serve.

1. start one rollout service (quickstart config, tiny model) as its own process;
2. saturation: closed loop at the service's concurrency limit -> S requests/s;
3. before: open loop at 0.5 S (normal latency);
4. overload: open loop at 2 S for --duration seconds; the service's RSS is sampled;
5. after: open loop at 0.5 S again.
Reports goodput / S during the overload (target >= 0.9), how fast the excess is refused
(RESOURCE_EXHAUSTED, p99 from send; target <= 10 ms), RSS growth over the overload (target
< 10 %) and the latency right after vs before. Everything is measured side by side in one
run; nothing else may run on the machine meanwhile.

    .venv/bin/python benchmarks/overload/run_overload.py --duration 600 --out results/overload
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _loadgen(address: str, out: Path, *args: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "hybridflow.loadgen",
        "--target",
        "rollout",
        "--address",
        address,
        "--out",
        str(out),
        "--prompt-len",
        "8:16",
        "--max-new-tokens",
        "16",
        "--n",
        "2",
        "--batch-size",
        "2",
        *args,
    ]
    subprocess.run(cmd, cwd=REPO, check=False, stdout=subprocess.DEVNULL)
    report = json.loads(out.read_text())
    run: dict[str, Any] = report["runs"][0]
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="overload seconds")
    parser.add_argument("--calibrate", type=float, default=30.0, help="saturation seconds")
    parser.add_argument("--phase", type=float, default=20.0, help="before/after seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="client deadline (s)")
    parser.add_argument("--out", default=f"results/overload/{time.strftime('%Y%m%d_%H%M%S')}")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("HYBRIDFLOW_TOKEN", "overload-benchmark")
    port_file = out / "rollout.addr"
    with (out / "rollout.log").open("wb") as log:
        service = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hybridflow.main.rollout",
                "--config",
                "deploy/configs/quickstart.yaml",
                "--port-file",
                str(port_file),
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    os.environ["HYBRIDFLOW_TOKEN"] = env["HYBRIDFLOW_TOKEN"]
    try:
        deadline = time.monotonic() + 300
        while not port_file.exists():
            if service.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"rollout service did not start; see {out}/rollout.log")
            time.sleep(0.2)
        address = port_file.read_text().strip()
        sys.path.insert(0, str(REPO))
        from hybridflow.job_config import load_job_config

        server = load_job_config("deploy/configs/quickstart.yaml").rollout.server
        limit = server.max_concurrent_rpcs or server.max_workers
        t = str(args.timeout)
        sat = _loadgen(
            address,
            out / "saturation.json",
            "--concurrency",
            str(limit),
            "--duration",
            str(args.calibrate),
            "--warmup",
            "3",
            "--timeout",
            t,
        )
        capacity = sat["requests_per_s"]
        print(f"saturation: {capacity:.2f} req/s at concurrency {limit}", flush=True)
        low = f"{0.5 * capacity:.3f}"
        before = _loadgen(
            address,
            out / "before.json",
            "--rate",
            low,
            "--duration",
            str(args.phase),
            "--warmup",
            "2",
            "--timeout",
            t,
        )
        rss: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                rss.append(_rss_bytes(service.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        over = _loadgen(
            address,
            out / "overload.json",
            "--rate",
            f"{2 * capacity:.3f}",
            "--duration",
            str(args.duration),
            "--warmup",
            "5",
            "--timeout",
            t,
        )
        stop.set()
        sampler.join()
        after = _loadgen(
            address,
            out / "after.json",
            "--rate",
            low,
            "--duration",
            str(args.phase),
            "--warmup",
            "0",
            "--timeout",
            t,
        )
    finally:
        service.terminate()
        service.wait(30)
    warm = rss[min(len(rss) - 1, 10)] if rss else 0  # after the first seconds of overload
    result = {
        "saturation_req_per_s": capacity,
        "overload_offered_req_per_s": over["sent_per_s"],
        "overload_goodput_req_per_s": over["requests_per_s"],
        "goodput_ratio": over["requests_per_s"] / capacity if capacity else 0.0,
        "overload_errors": over["errors"],
        "refused_ms": over.get("refused_ms"),
        "overload_latency_ms": over["latency_ms"],
        "rss_start_bytes": warm,
        "rss_end_bytes": rss[-1] if rss else 0,
        "rss_growth": (rss[-1] - warm) / warm if warm else 0.0,
        "latency_before_ms": before["latency_ms"],
        "latency_after_ms": after["latency_ms"],
        "errors_after": after["errors"],
        "duration_s": args.duration,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
