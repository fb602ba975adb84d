"""Learner-side DPO, KTO, ORPO and SFT steps on a random tiny Llama: first-step values, descent,
micro-batch invariance, refusals and held-out eval."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.data.preference import read_preference_dataset
from hybridflow.preference.config import PreferenceConfig
from hybridflow.services.learner.preference import preference_eval
from hybridflow.services.learner.worker import LearnerWorker
from tests.helpers import learner_config

NUM_STEPS = 5


def _worker(path: Path, **overrides: Any) -> LearnerWorker:
    base = {
        "optimizer": {"lr": 1e-2},
        "update": {"micro_batch_size": 8},
        "kl": {"use_reference": True},
    }
    return LearnerWorker(learner_config(base, **overrides), path)


def _records(worker: LearnerWorker, kind: str, num: int = 8) -> list[Any]:
    return read_preference_dataset(f"builtin:arith_{kind}", worker.tokenizer, kind, num=num)


@pytest.mark.parametrize(
    ("loss", "first_loss"),
    [
        ("dpo", math.log(2.0)),  # policy == reference: -log sigma(0)
        ("kto", 0.5),  # z0 = 0 and r = 0: 1 - sigma(0), weights 1
        ("sft", None),
    ],
)
def test_loss_starts_at_its_reference_value_and_decreases(
    tiny_checkpoint: Path, loss: str, first_loss: float | None
) -> None:
    worker = _worker(tiny_checkpoint)
    batch = _records(worker, loss)
    cfg = PreferenceConfig(loss=loss)  # type: ignore[arg-type]
    history = [worker.preference_step(batch, cfg) for _ in range(NUM_STEPS)]
    losses = [h["train/loss"] for h in history]
    if first_loss is not None:
        assert losses[0] == pytest.approx(first_loss, abs=1e-6)
    assert losses[-1] < losses[0]
    assert worker.policy_version == NUM_STEPS
    if loss == "dpo":
        assert history[0]["train/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
        assert history[-1]["train/rewards/margins"] > 0
    if loss == "kto":
        assert history[0]["kl"] == 0.0
        assert history[0]["train/count/chosen"] + history[0]["train/count/rejected"] == 8


@pytest.mark.parametrize(
    ("loss_type", "first_loss"),
    [
        ("hinge", 1.0),  # h = 0: max(0, 1 - 0)
        ("ipo", (1 / (2 * 0.1)) ** 2),  # h = 0: (0 - 1/(2 beta))^2 at beta 0.1
    ],
)
def test_dpo_variants_start_at_their_reference_value_and_widen_the_margin(
    tiny_checkpoint: Path, loss_type: str, first_loss: float
) -> None:
    worker = _worker(tiny_checkpoint)
    batch = _records(worker, "dpo")
    cfg = PreferenceConfig(loss="dpo", dpo_loss_type=loss_type)  # type: ignore[arg-type]
    history = [worker.preference_step(batch, cfg) for _ in range(NUM_STEPS)]
    losses = [h["train/loss"] for h in history]
    assert losses[0] == pytest.approx(first_loss, rel=1e-5)
    assert losses[-1] < losses[0]
    assert history[0]["train/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert history[-1]["train/rewards/margins"] > 0


@pytest.mark.parametrize(
    ("loss", "nll_prompt"),
    [("dpo", False), ("kto", False), ("sft", False), ("orpo", False), ("orpo", True)],
)
def test_micro_batches_give_the_one_batch_step(
    tiny_checkpoint: Path, loss: str, nll_prompt: bool
) -> None:
    cfg = PreferenceConfig(loss=loss, orpo_nll_prompt=nll_prompt)  # type: ignore[arg-type]
    results = []
    for micro in (8, 3):  # 3 leaves a partial micro-batch
        torch.manual_seed(0)
        worker = _worker(tiny_checkpoint, update={"micro_batch_size": micro})
        batch = _records(worker, cfg.record_kind)
        worker.preference_step(batch, cfg)
        metrics = worker.preference_step(batch, cfg)
        results.append(
            (metrics, {k: v.detach().clone() for k, v in worker.actor.named_parameters()})
        )
    (m_one, w_one), (m_micro, w_micro) = results
    for key in ("train/loss", "actor/grad_norm"):
        assert m_micro[key] == pytest.approx(m_one[key], abs=1e-5), key
    # Two AdamW steps at lr 1e-2: summation-order noise on near-zero gradients stays < 1e-4.
    for name, tensor in w_one.items():
        torch.testing.assert_close(w_micro[name], tensor, rtol=0, atol=1e-4)


@pytest.mark.parametrize("nll_prompt", [False, True])
def test_orpo_needs_no_reference_and_widens_the_log_odds(
    tiny_checkpoint: Path, nll_prompt: bool
) -> None:
    worker = _worker(tiny_checkpoint, kl={"use_reference": False})
    batch = _records(worker, "dpo")
    cfg = PreferenceConfig(loss="orpo", orpo_lambda=1.0, orpo_nll_prompt=nll_prompt)
    history = [worker.preference_step(batch, cfg) for _ in range(NUM_STEPS)]
    losses = [h["train/loss"] for h in history]
    assert losses[-1] < losses[0]
    first = history[0]  # loss = nll - lambda * mean log sigma(log OR)
    assert first["train/loss"] == pytest.approx(
        first["train/nll"] - first["train/log_odds_ratio"], rel=1e-5
    )
    assert history[-1]["train/log_odds_chosen"] > first["train/log_odds_chosen"]
    eval_only = preference_eval(worker, batch, beta=0.1)  # no reference: no implicit rewards
    assert "eval/rewards/accuracies" not in eval_only
    assert 0.0 <= eval_only["eval/mean_logps/accuracies"] <= 1.0


def test_refusals_name_the_problem(tiny_checkpoint: Path) -> None:
    worker = _worker(tiny_checkpoint)
    with pytest.raises(ValueError, match=r"records\[0\]: dpo needs PreferencePair"):
        worker.preference_step(_records(worker, "kto"), PreferenceConfig(loss="dpo"))
    no_ref = _worker(tiny_checkpoint, kl={"use_reference": False})
    with pytest.raises(ValueError, match="needs learner.kl.use_reference"):
        no_ref.preference_step(_records(no_ref, "dpo"), PreferenceConfig(loss="dpo"))
    with pytest.raises(ValueError, match="KTO needs >= 2 examples"):
        worker.preference_step(_records(worker, "kto", num=1), PreferenceConfig(loss="kto"))
    with pytest.raises(ValueError, match="preference.beta"):
        worker.preference_step(_records(worker, "dpo"), PreferenceConfig(beta=0.0))


def test_eval_starts_neutral_and_sees_training(tiny_checkpoint: Path) -> None:
    worker = _worker(tiny_checkpoint, update={"micro_batch_size": 4})
    pairs = read_preference_dataset("builtin:arith_dpo:test", worker.tokenizer, "dpo", num=6)
    before = preference_eval(worker, pairs, beta=0.1)
    assert before["eval/loss"] == pytest.approx(math.log(2.0), abs=1e-6)
    assert before["eval/rewards/accuracies"] == 0.0  # ties are not wins (TRL's strict >)
    assert before["eval/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert before["eval/nll"] > 0
    train = _records(worker, "dpo", num=16)
    for _ in range(NUM_STEPS):
        worker.preference_step(train, PreferenceConfig(loss="dpo"))
    after = preference_eval(worker, pairs, beta=0.1)
    assert after["eval/rewards/margins"] != pytest.approx(0.0, abs=1e-6)
    assert worker.policy_version == NUM_STEPS  # eval takes no step
