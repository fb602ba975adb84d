"""Service overhead: the same GRPO work in-process (RLTrainer) and over the three services.

Same model (builtin:tiny), same prompts, group size, sampling and number of steps; one
warm-up step each is excluded. The two run alternately ``--repeats`` times; prints and writes
the samples/s of both and the median of the per-pair ratios.

    python benchmarks/overhead/run_overhead.py [--steps 10] [--prompts 32] [--group 8]

Do not run it while anything else uses the CPU: the ratio is only meaningful side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


Rows = list[list[dict]]


def run_in_process(batches: Rows, group: int, max_new: int, lr: float) -> float:
    from hybridflow import RLTrainer
    from hybridflow.testing import mock_reward
    from hybridflow.types import SamplingParams

    trainer = RLTrainer(
        "builtin:tiny",
        mock_reward,
        algo="grpo",
        group_size=group,
        sampling=SamplingParams(max_new_tokens=max_new),
        optimizer={"lr": lr},
    )
    prompts = [[row["prompt"] for row in batch] for batch in batches]
    trainer.step(prompts[0])  # warm-up
    start = time.perf_counter()
    for batch in prompts[1:]:
        trainer.step(batch)
    elapsed = time.perf_counter() - start
    trainer.close()
    return sum(len(b) * group for b in prompts[1:]) / elapsed


def _ints(ids: Any) -> list[int]:
    """Token ids as a list (numpy arrays now; lists in older trees this script also runs on)."""
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def run_services(batches: Rows, group: int, max_new: int, lr: float) -> float:
    from transformers import AutoTokenizer

    from hybridflow.coordinator.config import CoordinatorConfig, SamplingConfig
    from hybridflow.coordinator.job import TrainingJob
    from hybridflow.coordinator.services import Services
    from hybridflow.data.datasets import PromptRecord
    from hybridflow.deploy.launcher import ServiceGroup
    from hybridflow.job_config import load_job_config
    from hybridflow.models import resolve_model_path
    from hybridflow.rpc.token import export_run_token
    from hybridflow.services.learner.client import GrpcLearnerClient
    from hybridflow.services.reward.client import GrpcRewardClient
    from hybridflow.services.rollout.client import GrpcRolloutClient

    overrides = [f"learner.optimizer.lr={lr}", "learner.algorithm=grpo"]
    job = load_job_config(None, overrides)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(job.model)))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        export_run_token(tmp, os.environ)  # services and clients share this run's token
        services = stack.enter_context(ServiceGroup(job, None, overrides, Path(tmp)))
        services.start()
        addr = services.wait_ready(600)
        svc = Services(
            rollouts=[GrpcRolloutClient(addr["rollout0"])],
            reward=GrpcRewardClient(addr["reward"]),
            learner=GrpcLearnerClient(addr["learner"]),
            weight_targets=[addr["rollout0"]],
            decode=lambda ids: tokenizer.decode(_ints(ids), skip_special_tokens=True),
        )

        def records(batch: list[dict]) -> list[PromptRecord]:
            return [
                PromptRecord(
                    row["prompt"],
                    tokenizer.encode(row["prompt"], add_special_tokens=False),
                    row["data_source"],
                    row["reward_model"]["ground_truth"],
                    {},
                    i,
                )
                for i, row in enumerate(batch)
            ]

        state = None

        def step(batch: list[dict]) -> None:
            """One step of ``batch`` through the schedule, as RLTrainer.step runs it."""
            nonlocal state
            num = (state.step if state else 0) + 1
            cfg = CoordinatorConfig(
                seed=num - 1,
                num_steps=num,
                prompts_per_step=len(batch),
                group_size=group,
                sampling=SamplingConfig(max_new_tokens=max_new),
                save_checkpoint=False,
                checkpoint_every=0,
                progress=False,
            )
            job = TrainingJob(cfg, svc, records(batch), Path(tmp), continue_from=state)
            job.run()
            state = job.state

        step(batches[0])  # warm-up
        start = time.perf_counter()
        for batch in batches[1:]:
            step(batch)
        elapsed = time.perf_counter() - start
    return sum(len(b) * group for b in batches[1:]) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps (plus one warm-up)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--repeats", type=int, default=3, help="alternating pairs (median ratio)")
    parser.add_argument("--out", type=Path, default=REPO / "results")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from hybridflow.data.arith import make_arith_rows

    rows = make_arith_rows(args.prompts * (args.steps + 1), seed=1234)
    batches = [rows[i * args.prompts : (i + 1) * args.prompts] for i in range(args.steps + 1)]
    pairs = []
    for repeat in range(args.repeats):  # alternate, so drift hits both sides alike
        in_process = run_in_process(batches, args.group, args.max_new_tokens, args.lr)
        over_grpc = run_services(batches, args.group, args.max_new_tokens, args.lr)
        pairs.append((in_process, over_grpc))
        print(
            f"repeat {repeat + 1}/{args.repeats}: in-process {in_process:.0f}, services "
            f"{over_grpc:.0f} samples/s ({over_grpc / in_process:.3f})",
            flush=True,
        )
    in_process = statistics.median(p[0] for p in pairs)
    over_grpc = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[1] / p[0] for p in pairs)
    result = {
        "benchmark": "overhead",
        "in_process_samples_per_s": round(in_process, 2),
        "services_samples_per_s": round(over_grpc, 2),
        "services_over_in_process": round(ratio, 3),
        "repeats": [
            {"in_process": round(a, 2), "services": round(b, 2), "ratio": round(b / a, 3)}
            for a, b in pairs
        ],
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "group_size": args.group,
        "max_new_tokens": args.max_new_tokens,
        "hardware": {"machine": platform.machine(), "cpus": __import__("os").cpu_count()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    out = args.out / time.strftime("%Y%m%d_%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"services / in-process samples/s: {result['services_over_in_process']:.2f}  ({out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
