"""TRL's ``GRPOTrainer`` on the algorithm suite's cold start, for a side-by-side comparison.

    python benchmarks/algorithm/trl_cold_start.py --seed 0 --out results/trl_seed0.jsonl

The same task as ``run_benchmark.py --cold-start`` (``COLD_START``): the randomly
initialised ``builtin:tiny-random``, ``builtin:arith`` prompts, 8 prompts x 8 completions per
step, temperature 1, the quickstart's ``max_new_tokens``, learning rate 3e-3, verl's
format_score 0.1 for an integer answer, our weight decay (0.01) and gradient clipping (1.0),
a constant learning rate. TRL generates and trains; only the prompts' token ids come from our
dataset loader (a subclass replaces ``_tokenize_prompts``), so both systems see the same
ids. Writes one JSON line per step: ``{"step", "reward"}`` (the batch's mean reward).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODEL = "builtin:tiny-random"
PROMPTS_PER_STEP = 8
GROUP_SIZE = 8
LR = 3.0e-3
FORMAT_SCORE = 0.1


def run(seed: int, steps: int, out: Path, data_size: int = 2048) -> list[float]:
    """Trains ``steps`` TRL GRPO steps; returns (and writes to ``out``) the reward per step."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

    from hybridflow.data.datasets import read_prompt_dataset
    from hybridflow.job_config import load_job_config
    from hybridflow.models import resolve_model_path
    from hybridflow.services.reward.rules import score_arith

    job = load_job_config(REPO / "deploy" / "configs" / "quickstart.yaml", [f"model={MODEL}"])
    model_dir = resolve_model_path(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records = read_prompt_dataset("builtin:arith", tokenizer, data_size, seed).records
    prompt_ids = [list(map(int, r.prompt_ids)) for r in records]

    class OurPrompts(GRPOTrainer):  # type: ignore[misc]
        def _tokenize_prompts(self, prompts: list[str]) -> tuple[list[list[int]], None, dict]:
            return [prompt_ids[int(p)] for p in prompts], None, {}

    def reward(completions: list[str], ground_truth: list[str], **_: Any) -> list[float]:
        return [score_arith(c, g, FORMAT_SCORE) for c, g in zip(completions, ground_truth)]

    rewards: list[float] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    sink = out.open("w")

    class Curve(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                sink.write(json.dumps({"step": state.global_step, "reward": rewards[-1]}) + "\n")
                sink.flush()

    args = GRPOConfig(
        output_dir=str(out.parent / f"trl_seed{seed}"),
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE,
        num_generations=GROUP_SIZE,
        max_completion_length=job.coordinator.sampling.max_new_tokens,
        temperature=job.coordinator.sampling.temperature,
        top_p=job.coordinator.sampling.top_p,
        learning_rate=LR,
        weight_decay=job.learner.optimizer.weight_decay,
        max_grad_norm=job.learner.optimizer.grad_clip,
        beta=0.0,
        loss_type="dapo",  # our token-mean over the batch
        scale_rewards="group",
        max_steps=steps,
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=seed,
    )
    data = Dataset.from_dict(
        {
            "prompt": [str(i) for i in range(len(records))],
            "ground_truth": [str(r.ground_truth) for r in records],
        }
    )
    trainer = OurPrompts(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.add_callback(Curve())
    try:
        trainer.train()
    finally:
        sink.close()
    return rewards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, required=True, help="JSONL of the reward per step")
    args = parser.parse_args(argv)
    rewards = run(args.seed, args.steps, args.out)
    half = rewards[len(rewards) // 2 :]
    print(f"TRL GRPO seed {args.seed}: mean reward over steps {len(rewards) - len(half) + 1}-"
          f"{len(rewards)}: {sum(half) / max(len(half), 1):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
