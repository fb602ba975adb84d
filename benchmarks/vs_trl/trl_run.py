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


class StepTimes:
    """Each TRL step's wall seconds and its split, filled by the hooks of ``timed_trainer``
    (generation, scoring) and ``step_clock`` (a step's begin and end)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.phase = dict.fromkeys(("generate", "score", "gen_and_score"), 0.0)
        self._start = 0.0

    @contextmanager
    def timed(self, key: str) -> Iterator[None]:
        """Adds the block's seconds to this step's ``key``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase[key] += time.perf_counter() - start

    def begin(self) -> None:
        self._start = time.perf_counter()
        self.phase = dict.fromkeys(self.phase, 0.0)

    def end(self) -> None:
        wall = time.perf_counter() - self._start
        self.rows.append({
            "step_s": wall,
            "generate_s": self.phase["generate"],
            "score_s": self.phase["score"],
            "train_s": wall - self.phase["gen_and_score"],
            "end": time.time(),
        })  # fmt: skip


def timed_trainer(base: type, times: StepTimes, prompt_ids: list[list[int]]) -> type:
    """TRL's ``base`` trainer on our prompt ids (a dataset row's prompt is its index), its
    generation and scoring timed into ``times``."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def _tokenize_prompts(self, prompts: list[str]) -> tuple[list[list[int]], None, dict]:
            return [prompt_ids[int(p)] for p in prompts], None, {}

        def _generate(self, prompts: list) -> Any:
            with times.timed("generate"):
                return super()._generate(prompts)

        def _calculate_rewards(self, *args: Any) -> Any:
            with times.timed("score"):
                return super()._calculate_rewards(*args)

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            with times.timed("gen_and_score"):
                return super()._generate_and_score_completions(inputs)

    return Timed


def step_clock(base: type, times: StepTimes) -> Any:
    """A ``TrainerCallback`` (``base``) that marks each step's begin and end in ``times``."""

    class StepClock(base):  # type: ignore[misc, valid-type]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            times.begin()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            times.end()

    return StepClock()


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

    def reward(completions: list[str], ground_truth: list[str], **_: Any) -> list[float]:
        return [score_arith(c, g, 0.0) for c, g in zip(completions, ground_truth)]

    data = Dataset.from_dict(
        {
            "prompt": [str(i) for i in range(len(records))],
            "ground_truth": [str(r.ground_truth) for r in records],
        }
    )
    times = StepTimes()
    trainer = timed_trainer(GRPOTrainer, times, prompt_ids)(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=grpo_config(steps, workload),
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.add_callback(step_clock(TrainerCallback, times))
    marks["trainer_built"] = time.time() - start  # the model loaded, the trainer set up
    trainer.train()
    first_step_s = times.rows[0]["end"] - start
    marks["first_step_done"] = first_step_s
    return {
        "steps": times.rows,
        "first_step_s": first_step_s,
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
