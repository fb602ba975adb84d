"""One update by a TRL trainer (``GRPOTrainer``, ``RLOOTrainer``) and one by hybridflow's
learner, on the same weights, prompts, completions and rewards.

TRL generates nothing here: its ``rollout_func`` hook (TRL's documented way to plug in an
outside generator) hands it our completions, and its reward function returns our rewards.
Everything after generation is TRL's own code, unchanged: the advantages
(``scale_rewards``), the loss (``loss_type``), ``max_grad_norm`` clipping and the AdamW step of
``transformers.Trainer``, for one step (``max_steps=1``, constant learning rate, one micro
batch, ``num_iterations=1``: the importance ratio is exactly 1, as in our first PPO epoch).
What we read back: the advantages and the loss TRL computed, the gradient norm it logged
(before clipping, like ours) and the weights after the step.

Prompts of one length: TRL pads prompts on the left and passes no position ids, so a shorter
prompt would see shifted positions; ours are padded on the right. That is a difference of
padding, not of the update, and equal lengths keep it out of the comparison.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridflow.config.loader import with_keys
from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.worker import LearnerWorker
from hybridflow.types import TrainSample

with warnings.catch_warnings():
    # On import TRL warns that it supports vLLM up to 0.31 (unused here), vLLM that
    # torch.jit is deprecated. Plain imports: TRL is in the lock, so a broken install fails.
    warnings.simplefilter("ignore")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer


@dataclass
class Batch:
    """One GRPO batch: ``prompts[g]`` has ``group_size`` completions, sample ``i`` is
    completion ``i`` of prompt ``i // group_size``."""

    prompts: list[list[int]]
    completions: list[list[int]]
    rewards: list[float]
    group_size: int

    def samples(self) -> list[TrainSample]:
        return [
            TrainSample(
                prompt_ids=self.prompts[i // self.group_size],
                response_ids=completion,
                rollout_logprobs=[0.0] * len(completion),
                reward=reward,
                group_id=i // self.group_size,
                policy_version=0,
            )
            for i, (completion, reward) in enumerate(zip(self.completions, self.rewards))
        ]


def example_batch(eos: int = 2) -> Batch:
    """3 prompts of 5 tokens, 4 completions each, of 2 to 8 tokens, every third ended by
    ``eos`` (the character tokenizer's ``</s>``); rewards spread so that clipping at 0.5 binds."""
    prompts = [[10 + (7 * g + k) % 50 for k in range(5)] for g in range(3)]
    completions = []
    for i in range(12):
        body = [20 + (5 * i + k) % 40 for k in range(1 + (3 * i) % 7)]
        completions.append(body + [eos] if i % 3 == 0 else body)
    rewards = [1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.9, 0.1, 0.0, 0.0, 1.0, 0.3]
    return Batch(prompts, completions, rewards, group_size=4)


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    advantages: list[float]
    """Per sample, in the batch's order."""
    grad_steps: list[dict[str, torch.Tensor]]
    """What the optimizer was given at each step: the gradients after clipping, by name."""
    params: dict[str, torch.Tensor]
    """After the last AdamW step."""

    @property
    def grads(self) -> dict[str, torch.Tensor]:
        """The last step's gradients (after clipping)."""
        return self.grad_steps[-1]


def one_batch_args(out_dir: Path, batch_size: int, steps: int) -> dict[str, Any]:
    """The ``transformers.TrainingArguments`` every oracle run shares: one batch per step,
    ``steps`` steps at a constant learning rate, on the CPU in fp32, logging every step,
    nothing saved or reported."""
    return dict(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch_size,
        max_steps=steps,
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
    )


def trl_step(
    model_dir: Path, batch: Batch, out_dir: Path, trainer: str = "grpo", **config: Any
) -> StepResult:
    """One TRL trainer step on ``batch``: ``trainer`` "grpo" (``GRPOTrainer``, fed through
    its ``rollout_func`` hook) or "rloo" (``RLOOTrainer``, which has no such hook: a subclass
    replaces its two generation methods, ``_tokenize_prompts`` and ``_generate_single_turn``,
    and nothing else). ``config``: the trainer config's fields."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"

    size = batch.group_size
    index = {tuple(c): i for i, c in enumerate(batch.completions)}
    assert len(index) == len(batch.completions), "completions must be distinct (they key rows)"

    def rows_of(prompts: list[str]) -> list[int]:
        # TRL's sampler repeats each prompt group_size times, in a row: row j of a group is
        # completion j of that prompt.
        return [int(p) * size + j % size for j, p in enumerate(prompts)]

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        rows = rows_of(prompts)
        completions = [batch.completions[i] for i in rows]
        return {
            "prompt_ids": [batch.prompts[i // size] for i in rows],
            "completion_ids": completions,
            "logprobs": [[0.0] * len(c) for c in completions],
        }

    class FixedRLOO(RLOOTrainer):  # type: ignore[misc]
        def _tokenize_prompts(self, prompts: list[str]) -> tuple[list[list[int]], None, dict]:
            self._rows = rows_of(prompts)
            return [batch.prompts[i // size] for i in self._rows], None, {}

        def _generate_single_turn(self, prompt_ids: Any, *_: Any) -> list[list[int]]:
            return [batch.completions[i] for i in self._rows]

    def reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
        return [batch.rewards[index[tuple(c)]] for c in completion_ids]

    common = dict(
        **one_batch_args(out_dir, len(batch.completions), steps=1),
        num_generations=size,
        beta=0.0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    inputs = dict(
        model=model,
        reward_funcs=reward,
        train_dataset=Dataset.from_dict({"prompt": [str(g) for g in range(len(batch.prompts))]}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    if trainer == "grpo":
        runner: Any = GRPOTrainer(
            args=GRPOConfig(**common, **config), rollout_func=rollout_func, **inputs
        )
    else:
        runner = FixedRLOO(args=RLOOConfig(**common, **config), **inputs)
    seen: dict[str, torch.Tensor] = {}
    compute_loss = runner._compute_loss

    def recording(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        for key in ("advantages", "completion_ids", "completion_mask"):
            seen[key] = inputs[key].detach().clone()
        return compute_loss(model, inputs)

    runner._compute_loss = recording
    grads = GradLog()

    class GradRecorder(TrainerCallback):  # type: ignore[misc]
        def on_pre_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            grads.record(runner.model)

    runner.add_callback(GradRecorder())
    runner.train()
    logged = runner.state.log_history[0]
    advantages = [0.0] * len(batch.completions)
    for row, mask, adv in zip(seen["completion_ids"], seen["completion_mask"], seen["advantages"]):
        ids = tuple(int(t) for t, m in zip(row, mask) if m)
        advantages[index[ids]] = float(adv)
    params = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}
    loss, grad_norm = float(logged["loss"]), float(logged["grad_norm"])
    return StepResult(loss, grad_norm, advantages, grads.steps, params)


def our_step(model_dir: Path, batch: Batch, **config: Any) -> StepResult:
    """One hybridflow learner step on ``batch``; ``config``: LearnerConfig fields."""
    fields: dict[str, Any] = {"update": {"micro_batch_size": len(batch.completions)}, "seed": 0}
    # ``config`` may use the flat names (``lr``): with_keys moves them as a job file's.
    worker = LearnerWorker(with_keys(with_keys(LearnerConfig(), fields), config), model_dir)
    from hybridflow.services.learner import worker as worker_module

    seen: dict[int, torch.Tensor] = {}
    original = worker_module.compute_advantages

    def recording(*args: Any, **kwargs: Any) -> Any:
        advantages, returns = original(*args, **kwargs)
        seen.update(advantages)
        return advantages, returns

    worker_module.compute_advantages = recording  # type: ignore[assignment]
    grads = GradLog()
    worker.actor_optim.register_step_pre_hook(lambda *_: grads.record(worker.actor))
    try:
        result = worker.train_step(batch.samples())
    finally:
        worker_module.compute_advantages = original  # type: ignore[assignment]
    params = {k: v.detach().clone() for k, v in worker.full_state_dict_items()}
    advantages = [float(seen[i][0]) for i in range(len(batch.completions))]
    metrics = result.metrics
    loss, grad_norm = metrics["actor/pg_loss"], metrics["actor/grad_norm"]
    return StepResult(loss, grad_norm, advantages, grads.steps, params)


class GradLog:
    """The gradients the optimizer is given at each step, by state-dict name (a tied head
    gets its embedding's)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def record(self, model: torch.nn.Module) -> None:
        self.steps.append(
            {
                name: p.grad.detach().clone()
                for name, p in model.state_dict(keep_vars=True).items()
                if getattr(p, "grad", None) is not None
            }
        )
