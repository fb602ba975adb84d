"""The Tinker-compatible service against the learner's own gRPC ``TrainStep``, one run, one
model (``builtin:tiny-qwen3`` by default), one LoRA rank on the same layers (the attention and
MLP projections, not the output head), one thread per process:

* ``train step s``: one RL step on a fixed batch (``--datums`` sequences of ``--prompt`` +
  ``--response`` tokens). Through the API: the SDK's ``forward_backward``
  (``importance_sampling``) and ``optim_step`` submitted back to back, timed until both
  results are in (the cookbook's pattern). Directly: the learner service's ``TrainStep`` on the
  same sequences (GRPO, one optimizer step), timed by its gRPC client.
* ``fwd/bwd latency s``: a ``forward_backward`` alone, from submit to result.
* ``calls/s``: tiny ``forward`` calls (one datum of 4 tokens) through the API, one at a time:
  what a call costs over HTTP, futures and the queue.
* ``two tenants``: two owners each running the train-step loop at once; each one's steps/s
  against its solo steps/s.

Both services run as real processes on loopback. The phases run one after another (never two
at once, except the two tenants, which share the service by design). Writes
``results/tinker_YYYYMMDD_HHMMSS/summary.json`` and prints the table. Run it on an otherwise
idle machine:

    python benchmarks/tinker/run_tinker.py                  # 16 datums x (16 + 48) tokens, 10 steps
    python benchmarks/tinker/run_tinker.py --steps 3 --warmup 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

KEYS = {"alice": "tml-bench-alice", "bob": "tml-bench-bob"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny-qwen3")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--datums", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", default="")
    return parser.parse_args(argv)


def _batch(args: argparse.Namespace, seed: int) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt, response, sampler log-probs) per sequence: random ids under 200."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(4, 200, args.prompt).tolist(),
            rng.integers(4, 200, args.response).tolist(),
            (-2.0 + 0.1 * rng.standard_normal(args.response)).tolist(),
        )
        for _ in range(args.datums)
    ]


def _datums(batch: list[tuple[list[int], list[int], list[float]]]) -> list[Any]:
    from tinker import types

    out = []
    for i, (prompt, response, logprobs) in enumerate(batch):
        tokens = prompt + response
        advantage = 1.0 if i % 2 else -1.0
        pad = [0.0] * (len(prompt) - 1)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": pad + logprobs,
                    "advantages": pad + [advantage] * len(response),
                },
            )
        )
    return out


def _tinker_steps(url: str, owner: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One owner's loop: warm-up, then timed train steps and fwd/bwd latencies."""
    import tinker
    from tinker import types

    adam = types.AdamParams(learning_rate=1e-4)
    data = _datums(_batch(args, seed))
    with tinker.ServiceClient(base_url=url, api_key=KEYS[owner]) as service:
        client = service.create_lora_training_client(  # the learner's targets: no output head
            base_model=args.model, rank=args.rank, seed=seed, train_unembed=False
        ).result()
        steps, latencies = [], []
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            fwdbwd = client.forward_backward(data, "importance_sampling")
            optim = client.optim_step(adam)
            fwdbwd.result()
            optim.result()
            if i >= args.warmup:
                steps.append(time.perf_counter() - start)
        for _ in range(max(3, args.steps // 2)):
            start = time.perf_counter()
            client.forward_backward(data, "importance_sampling").result()
            latencies.append(time.perf_counter() - start)
            client.optim_step(adam).result()
    return {"step_s": steps, "fwdbwd_s": latencies}


def _tinker_calls(url: str, args: argparse.Namespace) -> float:
    """Tiny forward calls per second, one at a time."""
    import tinker
    from tinker import types

    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
        loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0] * 4},
    )
    with tinker.ServiceClient(base_url=url, api_key=KEYS["alice"]) as service:
        client = service.create_lora_training_client(
            base_model=args.model, rank=args.rank, train_unembed=False
        ).result()
        for _ in range(5):
            client.forward([datum], "cross_entropy").result()
        start = time.perf_counter()
        for _ in range(args.calls):
            client.forward([datum], "cross_entropy").result()
        return args.calls / (time.perf_counter() - start)


def _learner_steps(address: str, args: argparse.Namespace) -> list[float]:
    from hybridflow.services.learner.client import GrpcLearnerClient
    from hybridflow.types import TrainSample

    samples = [
        TrainSample(prompt, response, logprobs, float(i % 2), i // 2, 0)
        for i, (prompt, response, logprobs) in enumerate(_batch(args, 0))
    ]
    client = GrpcLearnerClient(address)
    try:
        times = []
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            client.train_step(samples)
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        return times
    finally:
        client.close()


def _start_learner(folder: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    port_file = folder / "learner.addr"
    sets = [
        f"model={args.model}",
        f"learner.lora.rank={args.rank}",
        "learner.lora.alpha=32",
        "learner.optimizer.lr=1e-4",
        "learner.optimizer.grad_clip=0",
        "learner.loss.agg_mode=seq-mean-token-sum",
        f"learner.update.micro_batch_size={args.datums}",
        "learner.topology.num_threads=1",
        f"coordinator.sampling.max_new_tokens={args.response}",
    ]
    cmd = [sys.executable, "-m", "hybridflow.main.learner", "--port-file", str(port_file)]
    cmd += ["--config", str(REPO / "deploy/configs/quickstart.yaml")]
    for item in sets:
        cmd += ["--set", item]
    env = dict(os.environ)  # HYBRIDFLOW_TOKEN: set by main for the learner and its client
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the learner service did not come up")
        time.sleep(0.2)
    return proc, port_file.read_text().strip()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.tinker_service import running

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        learner, address = _start_learner(folder, args)
        try:
            direct = _learner_steps(address, args)
        finally:
            learner.terminate()
            learner.wait(timeout=120)
        with running(folder, KEYS, "--model", args.model) as (url, _):
            solo = _tinker_steps(url, "alice", args, seed=1)
            calls = _tinker_calls(url, args)
            together: dict[str, dict[str, Any]] = {}
            threads = [
                threading.Thread(
                    target=lambda o=owner, s=seed: together.__setitem__(
                        o, _tinker_steps(url, o, args, s)
                    )
                )
                for owner, seed in (("alice", 1), ("bob", 2))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    api_step = _median(solo["step_s"])
    learner_step = _median(direct)
    per_tenant = {o: 1 / _median(r["step_s"]) for o, r in together.items()}
    return {
        "config": vars(args),
        "learner_train_step_s": learner_step,
        "api_train_step_s": api_step,
        "api_over_learner": api_step / learner_step,
        "api_fwdbwd_latency_s": _median(solo["fwdbwd_s"]),
        "api_calls_per_s": calls,
        "solo_steps_per_s": 1 / api_step,
        "two_tenants_steps_per_s": per_tenant,
        "two_tenants_over_solo": {o: v * api_step for o, v in per_tenant.items()},
        "raw": {"learner": direct, "solo": solo, "together": together},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HYBRIDFLOW_TOKEN", secrets.token_urlsafe(16))
    report = run(args)
    out = Path(args.out or REPO / "results" / time.strftime("tinker_%Y%m%d_%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = [
        ("learner gRPC TrainStep, s/step", report["learner_train_step_s"]),
        ("API fwd/bwd + optim_step, s/step", report["api_train_step_s"]),
        ("API / learner", report["api_over_learner"]),
        ("API fwd/bwd latency, s", report["api_fwdbwd_latency_s"]),
        ("API tiny forward calls/s", report["api_calls_per_s"]),
        *((f"two tenants: {o} / solo", v) for o, v in report["two_tenants_over_solo"].items()),
    ]
    for name, value in rows:
        print(f"{name:40s} {value:8.3f}")
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
