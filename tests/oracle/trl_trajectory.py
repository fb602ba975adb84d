"""Consecutive GRPO steps by TRL's ``GRPOTrainer`` and by hybridflow's learner, on one fixed
schedule of prompts, completions and rewards (one ``Batch`` per step).

TRL generates nothing: its ``rollout_func`` hook returns step ``s``'s completions of the
prompts its sampler drew, and the reward function their rewards. Everything else is TRL's:
its ``RepeatSampler`` (the step's prompts in a shuffled order, each repeated
``num_generations`` times), the shuffle of the generated rows in ``_prepare_inputs``, the
advantages, the loss, clipping and AdamW. One generation is one optimizer step: the batch is
one generation batch (``per_device_train_batch_size`` = prompts x completions, so
``steps_per_generation`` = 1) and ``num_iterations`` is 1, so TRL skips the old log-probs
and its ratio is exactly 1.

Our learner trains the same rows in the order TRL trained them (read from the inputs of
TRL's ``_compute_loss``): the order does not change the update, but it is the order of every
sum, and those sums are what the comparison measures. What this module does not know: any
tolerance (``tests/oracle/compare.py``).
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hybridflow.config.loader import with_keys
from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.worker import LearnerWorker
from tests.oracle.trl_oracle import Batch, GradLog, one_batch_args

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # TRL's and vLLM's import-time warnings (trl_oracle.py)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer


def example_schedule(num_steps: int, eos: int = 2) -> list[Batch]:
    """``num_steps`` batches of 3 prompts of 5 tokens with 4 completions each, of 1 to 8
    tokens (about a third end in ``eos``), distinct within a step; rewards in [0, 1] that
    differ within every group, so no advantage is 0. Seeded: the same on every call."""
    draw = random.Random(0)
    schedule = []
    for _ in range(num_steps):
        prompts = [[draw.randrange(10, 60) for _ in range(5)] for _ in range(3)]
        completions: list[list[int]] = []
        while len(completions) < 12:
            body = [draw.randrange(20, 60) for _ in range(draw.randrange(1, 8))]
            completion = body + [eos] if draw.random() < 1 / 3 else body
            if completion not in completions:
                completions.append(completion)
        rewards = [round(draw.random(), 2) for _ in range(12)]
        for g in range(3):  # a 1 and a value below 0.5, or a 0 and one at least 0.5
            rewards[4 * g] = 1.0 if rewards[4 * g + 1] < 0.5 else 0.0
        schedule.append(Batch(prompts, completions, rewards, group_size=4))
    return schedule


def trl_defaults(out_dir: Path) -> GRPOConfig:
    """TRL's GRPO defaults, checked where the comparison relies on them."""
    args = GRPOConfig(output_dir=str(out_dir), use_cpu=True)
    assert (args.loss_type, args.scale_rewards, args.beta) == ("dapo", "group", 0.0)
    assert (args.num_iterations, args.entropy_coef, args.temperature) == (1, 0.0, 1.0)
    assert args.importance_sampling_level == "token" and args.delta is None
    assert args.adam_epsilon == 1e-8, "torch's AdamW default, which our learner uses"
    assert args.max_grad_norm == 1.0, "PLANTED clips 1% tighter than this"
    return args


def matched(args: GRPOConfig, lr: float, **changes: Any) -> dict[str, Any]:
    """Our learner's settings for TRL's ``args`` at learning rate ``lr`` (then ``changes``,
    dotted: ``{"loss.agg_mode": ...}``)."""
    keys: dict[str, Any] = {
        "optimizer": {
            "lr": lr,
            "grad_clip": args.max_grad_norm,
            "betas": (args.adam_beta1, args.adam_beta2),
            "weight_decay": args.weight_decay,
        },
        "advantage": {"norm_eps": 1e-4},  # TRL adds 1e-4 to the group's std
        "loss": {
            "agg_mode": "token-mean",  # dapo over one generation batch
            "clip_ratio_low": args.epsilon,
            "clip_ratio_high": args.epsilon if args.epsilon_high is None else args.epsilon_high,
            "clip_ratio_c": None,  # TRL has no dual clip
            "entropy_coef": args.entropy_coef,
        },
    }
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        keys[section][key] = value
    return keys


PLANTED: dict[str, dict[str, Any]] = {
    "clipping 1% tighter": {"optimizer.grad_clip": 0.99},  # TRL's max_grad_norm: 1.0
    "betas (0.9, 0.99)": {"optimizer.betas": (0.9, 0.99)},
    "std epsilon 1e-6 (verl's, our default)": {"advantage.norm_eps": 1e-6},
    "seq-mean-token-mean (TRL's grpo loss)": {"loss.agg_mode": "seq-mean-token-mean"},
}
"""Changes of one setting of ours (``matched``'s ``changes``), each of which a comparison
with TRL's defaults must tell apart, by name."""


@dataclass
class Trajectory:
    """What one side did at each step."""

    orders: list[list[int]] = field(default_factory=list)
    """Per step, the batch's sample indices in the order they were trained."""
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    """Before clipping."""
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """Per step, the gradients the optimizer was given (after clipping), by state-dict name."""
    params: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """Per step, the weights after its AdamW step."""
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """After the last step, AdamW's ``exp_avg`` and ``exp_avg_sq`` by parameter name."""
    optimizer_steps: int = 0
    """AdamW's step count after the last step."""
    start: dict[str, torch.Tensor] = field(default_factory=dict)
    """The weights before the first step."""


def _params(named: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in named}


def _read_optimizer(out: Trajectory, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    for name, p in model.named_parameters():
        state = optim.state[p]
        out.moments[name] = (state["exp_avg"].clone(), state["exp_avg_sq"].clone())
        out.optimizer_steps = int(state["step"])


def trl_steps(model_dir: Path, schedule: list[Batch], out_dir: Path, **config: Any) -> Trajectory:
    """``len(schedule)`` ``GRPOTrainer`` steps, step ``s`` on ``schedule[s]``; ``config``:
    GRPOConfig fields (TRL's defaults otherwise, but for ``one_batch_args``)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
    size, num_prompts = schedule[0].group_size, len(schedule[0].prompts)
    assert all(len(b.prompts) == num_prompts and b.group_size == size for b in schedule)
    index = [{tuple(c): i for i, c in enumerate(b.completions)} for b in schedule]
    assert all(len(ix) == len(b.completions) for ix, b in zip(index, schedule)), "distinct"
    generated: list[int] = []

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        step = trainer.state.global_step
        generated.append(step)
        batch = schedule[step]
        # The sampler repeats each prompt ``size`` times in a row: row j of a prompt's run is
        # its completion j.
        rows = [int(p) * size + j % size for j, p in enumerate(prompts)]
        completions = [batch.completions[i] for i in rows]
        return {
            "prompt_ids": [batch.prompts[i // size] for i in rows],
            "completion_ids": completions,
            "logprobs": [[0.0] * len(c) for c in completions],
        }

    def reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
        step = runner.state.global_step
        return [schedule[step].rewards[index[step][tuple(c)]] for c in completion_ids]

    args = GRPOConfig(
        **one_batch_args(out_dir, num_prompts * size, steps=len(schedule)),
        num_generations=size,
        **config,
    )
    assert args.steps_per_generation == 1 and args.num_iterations == 1, "one generation a step"
    runner = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [str(g) for g in range(num_prompts)]}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        rollout_func=rollout_func,
    )
    out = Trajectory()
    grads = GradLog()
    compute_loss = runner._compute_loss

    def recording(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        step = runner.state.global_step
        order = []
        for row, mask in zip(inputs["completion_ids"], inputs["completion_mask"]):
            order.append(index[step][tuple(int(t) for t, m in zip(row, mask) if m)])
        out.orders.append(order)
        return compute_loss(model, inputs)

    runner._compute_loss = recording

    class Recorder(TrainerCallback):  # type: ignore[misc]
        def on_pre_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            grads.record(runner.model)

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            out.params.append(_params(runner.model.state_dict().items()))

    runner.add_callback(Recorder())
    out.start = _params(runner.model.state_dict().items())
    runner.train()
    logged = [entry for entry in runner.state.log_history if "grad_norm" in entry]
    out.losses = [float(entry["loss"]) for entry in logged]
    out.grad_norms = [float(entry["grad_norm"]) for entry in logged]
    out.grads = grads.steps
    _read_optimizer(out, runner.model, runner.optimizer.optimizer)
    steps = list(range(len(schedule)))
    assert generated == steps and len(out.params) == len(out.orders) == len(schedule), (
        f"one generation per optimizer step: generated at steps {generated}"
    )
    return out


def our_steps(
    model_dir: Path, schedule: list[Batch], orders: list[list[int]], **config: Any
) -> Trajectory:
    """Our learner's ``train_step`` on each ``schedule[s]``, its samples in ``orders[s]``
    (one micro-batch, one optimizer step each); ``config``: LearnerConfig fields."""
    size = len(schedule[0].completions)
    fields: dict[str, Any] = {"update": {"micro_batch_size": size}, "seed": 0}
    # ``config`` may use the flat names (``lr``): with_keys moves them as a job file's.
    worker = LearnerWorker(with_keys(with_keys(LearnerConfig(), fields), config), model_dir)
    assert worker.versions_per_step() == 1, "one optimizer step per batch"
    out = Trajectory()
    grads = GradLog()
    worker.actor_optim.register_step_pre_hook(lambda *_: grads.record(worker.actor))
    for step, (batch, order) in enumerate(zip(schedule, orders, strict=True)):
        samples = batch.samples()
        for sample in samples:
            sample.policy_version = step
        metrics = worker.train_step([samples[i] for i in order]).metrics
        out.orders.append(list(order))
        out.losses.append(metrics["actor/pg_loss"])
        out.grad_norms.append(metrics["actor/grad_norm"])
        out.params.append(_params(worker.full_state_dict_items()))
    out.grads = grads.steps
    _read_optimizer(out, worker.actor, worker.actor_optim)
    return out


def max_weight_diffs(a: Trajectory, b: Trajectory) -> list[float]:
    """Per step, the largest absolute difference of any weight."""
    return [
        max(float((pa[k] - pb[k]).abs().max()) for k in pa) for pa, pb in zip(a.params, b.params)
    ]
