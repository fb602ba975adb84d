"""A whole model over the gRPC weight stream into a real rollout service, with the default limits.

Starts ``hybridflow.main.rollout`` (the ``hf`` engine, ``--model``, the replica's ``--dtype``,
``server.max_message_bytes`` left at its 256 MiB) as its own process, then streams it the
model's weights, each changed by a constant, ``--syncs`` times through ``GrpcWeightSyncClient``
(the learner's gRPC transport: chunks of ``chunk_bytes``, cast to the dtype the replica
names). Reports per dtype: seconds per sync (median), bytes on the wire, the replica's peak
RSS, and whether the replica then serves the new weights: its log-probs of a probe against
this process's model with the same change (``|diff|`` at most 1e-4 in fp32; bf16 is
reported, not judged).

    python benchmarks/weight_sync/grpc_model.py [--model builtin:qwen2.5-0.5b-shape]
        [--dtypes float32,bfloat16] [--syncs 3]

Run it on an otherwise idle machine: both processes use one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

JOB = """\
model: {model}
rollout: {{engine: hf, device: cpu, num_threads: 1, dtype: {dtype}}}
"""


def start_replica(model: str, dtype: str, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The rollout service in its own process; (process, address) once it serves."""
    config = work / f"job-{dtype}.yaml"
    config.write_text(JOB.format(model=model, dtype=dtype))
    port_file = work / f"port-{dtype}"
    log = (work / f"rollout-{dtype}.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hybridflow.main.rollout",
            "--config",
            str(config),
            "--port-file",
            str(port_file),
        ],  # fmt: skip
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 600
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None:
            raise RuntimeError(f"the rollout service exited {proc.returncode}: see {log.name}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the rollout service did not serve within 600 s")
        time.sleep(0.5)
    return proc, port_file.read_text().strip()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(model: str, dtype: str, syncs: int, work: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.algorithms.logprobs import logprobs_from_logits
    from hybridflow.models import resolve_model_path
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.weights.client import GrpcWeightSyncClient
    from hybridflow.weights.verify import Probe

    learner = AutoModelForCausalLM.from_pretrained(resolve_model_path(model), dtype=torch.float32)
    proc, address = start_replica(model, dtype, work)
    client = GrpcWeightSyncClient(address, ChannelConfig(timeout_s=600))
    try:
        seconds, num_bytes = [], 0
        for version in range(1, syncs + 1):
            with torch.no_grad():
                for p in learner.parameters():
                    p.add_(1e-3)
            named = [(n, p.detach()) for n, p in learner.named_parameters()]
            start = time.perf_counter()
            num_bytes = client.send(named, version).num_bytes
            seconds.append(time.perf_counter() - start)
            print(f"{dtype} sync {version}: {seconds[-1]:.2f} s, {num_bytes / 2**20:.0f} MiB",
                  flush=True)  # fmt: skip
        probe = Probe.for_vocab(learner.config.vocab_size)
        served, served_version = client.probe_logprobs(probe.prompt_ids, probe.response_ids, 600)
        ids = torch.tensor([[*probe.prompt_ids, *probe.response_ids]])
        with torch.no_grad():
            logits = learner(ids).logits[0, len(probe.prompt_ids) - 1 : -1]
        expected = logprobs_from_logits(logits.float(), torch.tensor(probe.response_ids), 1.0)
        diff = float(np.max(np.abs(served - expected.numpy())))
        return {
            "dtype": dtype,
            "median_sync_s": statistics.median(seconds),
            "syncs_s": seconds,
            "wire_bytes": num_bytes,
            "model_params": sum(p.numel() for p in learner.parameters()),
            "replica_peak_rss_mb": peak_rss_mb(proc.pid),
            "served_version": served_version,
            "probe_max_abs_diff": diff,
        }
    finally:
        client.close()
        proc.terminate()
        proc.wait(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:qwen2.5-0.5b-shape")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the results JSON here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("HYBRIDFLOW_TOKEN", os.urandom(16).hex())  # both sides read it
    import torch

    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes.split(","):
            results.append(measure(args.model, dtype, args.syncs, Path(tmp)))
    for r in results:
        print(f"{r['dtype']:9s} {r['median_sync_s']:7.2f} s/sync  {r['wire_bytes'] / 2**20:8.0f} "
              f"MiB  replica peak {r['replica_peak_rss_mb']:7.0f} MB  version "
              f"{r['served_version']}  probe |diff| {r['probe_max_abs_diff']:.2e}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    fp32 = [r for r in results if r["dtype"] == "float32"]
    return 0 if all(r["probe_max_abs_diff"] <= 1e-4 for r in fp32) else 1


if __name__ == "__main__":
    raise SystemExit(main())
