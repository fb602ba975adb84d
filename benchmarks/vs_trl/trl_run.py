"""TRL's ``GRPOTrainer`` on one of ``workload.py``'s workloads, timed per step, for
``run_benchmark.py``.

    python benchmarks/vs_trl/trl_run.py --steps 5 --threads 2 --out results/trl.json \
        [--workload 0.5b|quickstart]

The 0.5B workload (``workload.py``): ``builtin:qwen2.5-0.5b-shape`` in fp32, ``builtin:arith``
prompts rendered by its chat template, 8 prompts x 8 completions of 4 tokens a step at
temperature 1, the binary reward of ``score_arith``; one optimizer step per batch, in
micro-batches of 8 completions (TRL's default ``per_device_train_batch_size``, 8 of them
accumulated). The quickstart's: ``builtin:tiny``, 32 prompts x 8 completions, micro-batches
of 64. TRL generates with the model it trains (Hugging Face ``generate``), in one process of
``--threads`` threads.

Settings, written down: TRL's defaults except where the workload fixes a value (batch,
lengths, temperature, learning rate, clipping, no KL: ``beta`` 0 is TRL's default too), and
``gradient_checkpointing: false`` (TRL's GRPO default is true; hybridflow's learner does not
checkpoint by default, and at this size recomputing the forward only slows TRL down).

Writes JSON: each step's wall seconds (from the trainer's step begin to its end) and the
split of it (``generate``: ``_generate``; ``score``: the reward functions; ``train``: the
rest, i.e. log-probs, loss, backward, optimizer), the seconds from process start to the end
of the first step and to the start-up's marks before it (``imported``: torch, transformers,
TRL; ``trainer_built``: the model loaded and the trainer set up), and the process's peak
RSS. ``--keep-freed-memory`` gives TRL's process
the allocator setting hybridflow's services run with (``hybridflow/utils/malloc.py``): what
that setting alone would buy TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROCESS_START = time.time()
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.vs_trl.workload import (  # noqa: E402
    WORKLOAD,
    WORKLOADS,
    Workload,
    peak_rss_bytes,
    process_start_time,
)


def grpo_config(steps: int, workload: Workload = WORKLOAD) -> Any:
    """TRL's settings: its defaults but for the workload's numbers, no KL (``beta`` 0, as
    ours) and no gradient checkpointing (ours does not checkpoint)."""
    from trl import GRPOConfig

    micro = workload.micro_batch_size
    return GRPOConfig(
        output_dir=str(REPO / "results" / "vs_trl_trainer"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=workload.completions_per_step // micro,
        num_generations=workload.group_size,
        max_completion_length=workload.max_new_tokens,
        temperature=workload.temperature,
        learning_rate=workload.lr,
        max_grad_norm=workload.grad_clip,
        beta=0.0,
        gradient_checkpointing=False,
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )


def run(
    steps: int, threads: int, keep_freed_memory: bool = False, workload: Workload = WORKLOAD
) -> dict[str, Any]:
    start = process_start_time(PROCESS_START)
    marks: dict[str, float] = {}  # the start-up's phases, seconds since the process started
    import torch

    torch.set_num_threads(threads)
    if keep_freed_memory:  # hybridflow's allocator setting, to see what it buys TRL
        from hybridflow.utils.malloc import keep_freed_memory as keep

        keep()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOTrainer

    from hybridflow.data.datasets import read_prompt_dataset
    from hybridflow.models import resolve_model_path
    from hybridflow.services.reward.rules import score_arith

    marks["imported"] = time.time() - start

    model_dir = resolve_model_path(workload.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records = read_prompt_dataset(workload.data, tokenizer, workload.data_size, 0).records
    prompt_ids = [list(map(int, r.prompt_ids)) for r in records]
    phase: dict[str, float] = {"generate": 0.0, "score": 0.0, "gen_and_score": 0.0}

    @contextmanager
    def timed(key: str) -> Iterator[None]:
        """Adds the block's seconds to ``phase[key]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            phase[key] += time.perf_counter() - start

    class Timed(GRPOTrainer):  # type: ignore[misc]
        """TRL's trainer on our prompt ids, its generation and scoring timed."""

        def _tokenize_prompts(self, prompts: list[str]) -> tuple[list[list[int]], None, dict]:
            return [prompt_ids[int(p)] for p in prompts], None, {}

        def _generate(self, prompts: list) -> Any:
            with timed("generate"):
                return super()._generate(prompts)

        def _calculate_rewards(self, *args: Any) -> Any:
            with timed("score"):
                return super()._calculate_rewards(*args)

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            with timed("gen_and_score"):
                return super()._generate_and_score_completions(inputs)

    def reward(completions: list[str], ground_truth: list[str], **_: Any) -> list[float]:
        return [score_arith(c, g, 0.0) for c, g in zip(completions, ground_truth)]

    rows: list[dict[str, float]] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.start = time.perf_counter()
            phase.update(generate=0.0, score=0.0, gen_and_score=0.0)

        def on_step_end(self, *_: Any, **__: Any) -> None:
            wall = time.perf_counter() - self.start
            rows.append({
                "step_s": wall,
                "generate_s": phase["generate"],
                "score_s": phase["score"],
                "train_s": wall - phase["gen_and_score"],
                "end": time.time(),
            })  # fmt: skip

    args = grpo_config(steps, workload)
    data = Dataset.from_dict(
        {
            "prompt": [str(i) for i in range(len(records))],
            "ground_truth": [str(r.ground_truth) for r in records],
        }
    )
    trainer = Timed(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.add_callback(StepClock())
    marks["trainer_built"] = time.time() - start  # the model loaded, the trainer set up
    trainer.train()
    marks["first_step_done"] = rows[0]["end"] - start
    return {
        "steps": rows,
        "first_step_s": rows[0]["end"] - start,
        "startup_marks": marks,
        "peak_rss_bytes": peak_rss_bytes(),
        "threads": threads,
        "keep_freed_memory": keep_freed_memory,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="0.5b")
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="glibc's malloc as hybridflow's services set it (hybridflow.utils.malloc)",
    )
    args = parser.parse_args(argv)
    result = run(args.steps, args.threads, args.keep_freed_memory, WORKLOADS[args.workload])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
