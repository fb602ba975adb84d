"""``forward_backward`` + ``optim_step`` of the Tinker-compatible service's tenant engine equal
the learner's own train step on the same batch, for each built-in loss: the same adapter at
the start, the same AdamW settings, and the mapping from the learner's normalisation to
Tinker's sums written out:

* ``cross_entropy`` is the learner's ``rft`` step (SFT on every sample, NLL over completion
  tokens / their count): weights ``1 / tokens`` on completion tokens, 0 on the prompt;
* ``importance_sampling`` is a GRPO step with truncated importance sampling against the
  rollout log-probs (``loss.off_policy: tis``, a cap no weight reaches) and
  ``seq-mean-token-sum``: advantages ``A / sequences``, the rollout's log-probs as the sampler's;
* ``ppo`` is GRPO over two epochs (the second epoch's ratio is clipped, at 0.8 and 1.2):
  log-probs from a forward before the first step, then two ``forward_backward`` + ``optim_step``.

The learner runs in-process on one rank (``LearnerWorker``), the tenant engine on its own copy
of the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from hybridflow.algorithms.advantages import grpo_outcome_advantages
from hybridflow.services.learner.tenants import (
    LORA_ALPHA,
    AdamParams,
    AdapterSpec,
    Datum,
    TenantTrainer,
)
from hybridflow.services.learner.worker import LearnerWorker
from hybridflow.types import TrainSample
from tests.helpers import learner_config

LR = 5e-2
ADAM = AdamParams(learning_rate=LR, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
BASE = {
    "lora": {"rank": 4, "alpha": LORA_ALPHA},
    "optimizer": {"lr": LR, "betas": (0.9, 0.999), "weight_decay": 0.01, "grad_clip": 0.0},
    "update": {"micro_batch_size": 16},
}


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(6):
        response = torch.randint(4, 60, (3 + i % 3,), generator=g).tolist()
        rollout = (-2.5 + 0.3 * torch.randn(len(response), generator=g)).tolist()
        prompt = torch.randint(4, 60, (4,), generator=g).tolist()
        out.append(TrainSample(prompt, response, rollout, float(i % 3 == 0) + 0.1 * i, i // 3, 0))
    return out


def _pair(path: Path, config: dict) -> tuple[LearnerWorker, TenantTrainer]:  # type: ignore[type-arg]
    """The learner, and the tenant engine with tenant "t" holding the learner's adapter."""
    learner = LearnerWorker(learner_config(BASE, config), path)
    trainer = TenantTrainer(AutoModelForCausalLM.from_pretrained(path).eval())
    trainer.create("t", AdapterSpec(rank=4, train_unembed=False))
    trainer.load("t", {"adapter": _adapter(learner)}, optimizer=False)
    return learner, trainer


def _adapter(learner: LearnerWorker) -> dict[str, torch.Tensor]:
    """The learner's adapter under the tenant engine's parameter names."""
    return {
        name.replace(".default.", ".{tenant}."): p.detach().clone()
        for name, p in learner.actor.named_parameters()
        if ".lora_" in name
    }


def _assert_same_adapter(
    learner: LearnerWorker, trainer: TenantTrainer, atol: float = 2e-5
) -> None:
    """Equal within fp32 noise. AdamW divides by the gradient's own size, so an element whose
    gradient is near zero carries the noise into its step: ``atol`` is a small share of the
    learning rate (0.05 a step)."""
    mine = trainer.state("t", optimizer=False)["adapter"]
    theirs = _adapter(learner)
    assert set(mine) == set(theirs)
    moved = 0
    for name, tensor in theirs.items():
        torch.testing.assert_close(mine[name], tensor, atol=atol, rtol=1e-4, msg=name)
        moved += int(not torch.equal(tensor, torch.zeros_like(tensor)))
    assert moved > 0


def _datums(samples: list[TrainSample], per_token: list[dict[str, np.ndarray]]) -> list[Datum]:
    """Prompt + completion as the model input; position i predicts token i + 1; the loss
    inputs are 0 on the prompt's positions and ``per_token``'s on the completion's."""
    out = []
    for sample, extra in zip(samples, per_token, strict=True):
        tokens = np.concatenate([sample.prompt_ids, sample.response_ids]).astype(np.int64)
        start = len(sample.prompt_ids) - 1
        inputs = {"target_tokens": np.concatenate([tokens[1:], [0]])}
        for key, values in extra.items():
            full = np.zeros(len(tokens), dtype=np.float32)
            full[start : start + len(values)] = values
            inputs[key] = full
        out.append(Datum(tokens=tokens, inputs=inputs))
    return out


def _advantages(samples: list[TrainSample]) -> np.ndarray:
    scores = torch.tensor([s.reward for s in samples])
    groups = torch.tensor([s.group_id for s in samples])
    return grpo_outcome_advantages(scores, groups).numpy()


def test_cross_entropy_is_the_learners_sft_step(tiny_model_path: Path) -> None:
    learner, trainer = _pair(tiny_model_path, {"algorithm": "rft", "rft": {"threshold": -1.0}})
    samples = _samples()
    learner.train_step(samples)
    tokens = sum(len(s.response_ids) for s in samples)
    weights = [{"weights": np.full(len(s.response_ids), 1 / tokens)} for s in samples]
    trainer.forward_backward("t", _datums(samples, weights), "cross_entropy")
    trainer.optim_step("t", ADAM)
    _assert_same_adapter(learner, trainer)


def test_importance_sampling_is_the_learners_tis_step(tiny_model_path: Path) -> None:
    config = {"loss": {"agg_mode": "seq-mean-token-sum", "off_policy": "tis", "is_cap": 1e6}}
    learner, trainer = _pair(tiny_model_path, config)
    samples = _samples()
    learner.train_step(samples)
    advantages = _advantages(samples) / len(samples)
    inputs = [
        {"advantages": np.full(len(s.response_ids), a), "logprobs": s.rollout_logprobs}
        for s, a in zip(samples, advantages, strict=True)
    ]
    trainer.forward_backward("t", _datums(samples, inputs), "importance_sampling")
    trainer.optim_step("t", ADAM)
    _assert_same_adapter(learner, trainer)


def test_ppo_is_the_learners_two_epoch_clipped_step(tiny_model_path: Path) -> None:
    config = {
        "loss": {"agg_mode": "seq-mean-token-sum", "clip_ratio_c": None},
        "update": {"epochs": 2},
    }
    learner, trainer = _pair(tiny_model_path, config)
    samples = _samples()
    metrics = learner.train_step(samples).metrics
    assert metrics["actor/pg_clipfrac"] > 0  # the clip is in play, not only ratio 1
    advantages = _advantages(samples) / len(samples)
    zeros = [{"weights": np.zeros(len(s.response_ids))} for s in samples]
    before, _ = trainer.forward_backward("t", _datums(samples, zeros), "cross_entropy", None, True)
    inputs = []
    for sample, a, lp in zip(samples, advantages, before, strict=True):
        start = len(sample.prompt_ids) - 1
        old = lp[start : start + len(sample.response_ids)]
        inputs.append({"advantages": np.full(len(sample.response_ids), a), "logprobs": old})
    for _ in range(2):
        trainer.forward_backward("t", _datums(samples, inputs), "ppo")
        trainer.optim_step("t", ADAM)
    _assert_same_adapter(learner, trainer, atol=LR * 4e-3)  # two steps: seen up to 9e-5
