"""LearnerWorker with algorithm dpo / rft on a random tiny Llama: the first DPO loss, descent
on a fixed batch, exactly the kept RFT samples trained, and batches with nothing to train."""

import math
from pathlib import Path

import pytest
import torch

from hybridflow.services.learner.worker import LearnerWorker
from tests.helpers import learner_config

NUM_STEPS = 4


def _worker(path: Path, **overrides: object) -> LearnerWorker:
    base = {
        "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
        "update": {"micro_batch_size": 4},
    }
    return LearnerWorker(learner_config(base, **overrides), path)


def _params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.full_state_dict_items()}


def test_dpo_loads_the_reference_and_learns_the_pairs(tiny_checkpoint: Path, make_samples) -> None:
    worker = _worker(tiny_checkpoint, algorithm="dpo")  # no use_reference: the preset loads it
    assert worker.reference is not None and worker.critic is None
    # Groups of 2: (1, 0) and (0, 1) give a pair each, (0.5, 0.5) is tied.
    samples = make_samples([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    history = [worker.train_step(samples).metrics for _ in range(NUM_STEPS)]
    first, last = history[0], history[-1]
    assert first["actor/dpo_loss"] == pytest.approx(math.log(2.0), abs=1e-5)  # policy == ref
    assert first["actor/pg_loss"] == first["actor/dpo_loss"]
    assert first["actor/reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert first["actor/pref_accuracy"] == 0.0  # equal implicit rewards: not strictly greater
    assert first["actor/num_pairs"] == 2.0 and first["actor/num_tied_groups"] == 1.0
    assert first["actor/grad_norm"] > 0
    assert last["actor/dpo_loss"] < first["actor/dpo_loss"]
    assert last["actor/reward_margin"] > first["actor/reward_margin"]
    assert last["actor/pref_accuracy"] > first["actor/pref_accuracy"]
    assert worker.policy_version == NUM_STEPS
    assert last["training/policy_version"] == NUM_STEPS
    assert first["critic/score/mean"] == pytest.approx(0.5)


def test_dpo_batch_without_pairs_takes_no_step_but_bumps_the_version(
    tiny_checkpoint: Path, make_samples
) -> None:
    worker = _worker(tiny_checkpoint, algorithm="dpo")
    before = _params(worker)
    result = worker.train_step(make_samples([1.0, 1.0, 0.0, 0.0]))
    assert result.policy_version == 1 == worker.policy_version
    after = _params(worker)
    assert all(torch.equal(before[k], after[k]) for k in before)
    m = result.metrics
    assert m["actor/num_pairs"] == 0.0 and m["actor/num_tied_groups"] == 2.0
    assert m["actor/dpo_loss"] == 0.0 and m["actor/grad_norm"] == 0.0


def _token_mean_nll(worker: LearnerWorker, samples: list, kept: list[int]) -> float:
    logprobs = worker.compute_logprobs(
        [samples[i].prompt_ids for i in kept], [samples[i].response_ids for i in kept], 1.0
    )
    return -sum(float(lp.sum()) for lp in logprobs) / sum(len(lp) for lp in logprobs)


def test_rft_trains_exactly_the_kept_samples(tiny_checkpoint: Path, make_samples) -> None:
    worker = _worker(tiny_checkpoint, algorithm="rft", rft={"threshold": 0.5})
    assert worker.reference is None
    samples = make_samples([1.0, 0.0, 0.5, 0.49])  # kept at >= 0.5: samples 0 and 2
    expected_first = _token_mean_nll(worker, samples, [0, 2])
    history = [worker.train_step(samples).metrics for _ in range(NUM_STEPS)]
    first, last = history[0], history[-1]
    assert first["actor/sft_nll"] == pytest.approx(expected_first, abs=1e-5)
    assert first["actor/pg_loss"] == first["actor/sft_nll"]
    assert first["actor/rft_kept"] == 2.0 and first["actor/rft_kept_frac"] == 0.5
    assert last["actor/sft_nll"] < first["actor/sft_nll"]
    assert worker.policy_version == NUM_STEPS


def test_rft_batch_with_nothing_kept_leaves_weights_and_bumps_the_version(
    tiny_checkpoint: Path, make_samples
) -> None:
    worker = _worker(tiny_checkpoint, algorithm="rft")  # threshold 1.0
    before = _params(worker)
    result = worker.train_step(make_samples([0.0, 0.5, 0.99]))
    assert result.policy_version == 1 == worker.policy_version
    after = _params(worker)
    assert all(torch.equal(before[k], after[k]) for k in before)
    m = result.metrics
    assert m["actor/rft_kept"] == 0.0 and m["actor/rft_kept_frac"] == 0.0
    assert m["actor/sft_nll"] == 0.0 and m["actor/grad_norm"] == 0.0
