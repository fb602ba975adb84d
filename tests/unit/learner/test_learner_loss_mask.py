"""Multi-turn loss masks in the learner: the losses, advantages and off-policy weights see the
policy's tokens only, and the mask crosses the wire intact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.algorithms import last_token_scores
from hybridflow.services.learner.convert import batch_from_proto, batch_to_proto
from hybridflow.services.learner.worker import LearnerWorker
from hybridflow.types import TrainSample
from tests.helpers import learner_config

TOL = 1e-6


def _worker(path: Path, **keys: Any) -> LearnerWorker:
    base = {"optimizer": {"lr": 1e-2, "weight_decay": 0.0}, "update": {"micro_batch_size": 2}}
    return LearnerWorker(learner_config(base, keys), path)


def _masked(samples: list[TrainSample], observation_logprob: float) -> list[TrainSample]:
    """Each response split as policy tokens / observation tokens / policy tokens (when long
    enough); observation log-probs set to ``observation_logprob``."""
    out = []
    for s in samples:
        n = len(s.response_ids)
        mask = np.ones(n, np.uint8)
        if n >= 3:
            mask[1 : n - 1] = 0
        logprobs = np.where(mask == 1, -1.0, observation_logprob).astype(np.float32)
        out.append(
            TrainSample(
                prompt_ids=s.prompt_ids,
                response_ids=s.response_ids,
                rollout_logprobs=logprobs,
                reward=s.reward,
                group_id=s.group_id,
                policy_version=s.policy_version,
                loss_mask=mask,
            )
        )
    return out


def _params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.full_state_dict_items()}


@pytest.mark.parametrize(
    "keys",
    [
        {"algorithm": "grpo", "loss": {"off_policy": "tis"}},
        {"algorithm": "grpo", "advantage_estimator": "rloo", "loss": {"off_policy": "decoupled"}},
        {"algorithm": "ppo", "update": {"epochs": 2}},
    ],
    ids=["grpo-tis", "rloo-decoupled", "ppo-gae"],
)
def test_observation_tokens_do_not_reach_the_update(
    tiny_checkpoint: Path, make_samples: Callable[..., Any], keys: dict[str, Any]
) -> None:
    """The step is the same whatever the rollout said of observation tokens (their log-probs
    enter no weight, ratio or metric), and differs from the step on unmasked samples."""
    base = make_samples([1.0, 0.0, 0.3, 0.9, 0.5, 0.0])
    assert any(len(s.response_ids) >= 3 for s in base)
    results = {}
    for name, samples in (
        ("masked", _masked(base, -1.0)),
        ("masked_other_logprobs", _masked(base, -9.0)),
        ("unmasked", base),
    ):
        worker = _worker(tiny_checkpoint, **keys)
        results[name] = (worker.train_step(samples).metrics, _params(worker))
    (m1, p1), (m2, p2), (m3, p3) = results.values()
    for key, value in m1.items():
        assert m2[key] == pytest.approx(value, abs=TOL, rel=TOL), key
    for key, tensor in p1.items():
        torch.testing.assert_close(p2[key], tensor, atol=TOL, rtol=0, msg=key)
    assert max(float((p3[k] - p1[k]).abs().max()) for k in p1) > 1e-5  # the mask mattered


def test_last_token_scores_lands_on_the_last_policy_token() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    out = last_token_scores(torch.tensor([2.0, 3.0]), mask)
    assert out.tolist() == [[0, 0, 0, 0, 2.0, 0], [3.0, 0, 0, 0, 0, 0]]


def test_loss_masks_cross_the_wire(make_samples: Callable[..., Any]) -> None:
    samples = _masked(make_samples([1.0, 0.0, 0.5]), -3.0)
    samples.append(make_samples([0.2])[0])  # a sample without a mask: all 1 on the wire
    back = batch_from_proto(batch_to_proto(samples))
    for got, want in zip(back, samples, strict=True):
        expected = want.loss_mask if want.loss_mask is not None else np.ones(len(want.response_ids))
        assert got.loss_mask is not None and got.loss_mask.tolist() == list(expected)
    single = batch_from_proto(batch_to_proto(make_samples([1.0, 0.0])))
    assert all(s.loss_mask is None for s in single)


def test_bad_loss_masks_are_refused(make_samples: Callable[..., Any]) -> None:
    samples = _masked(make_samples([1.0, 0.0]), -3.0)
    msg = batch_to_proto(samples)
    msg.loss_masks = msg.loss_masks[:-1]
    with pytest.raises(ValueError, match="loss_masks: .* flags for"):
        batch_from_proto(msg)
    msg = batch_to_proto(samples)
    msg.loss_masks = b"\x02" + msg.loss_masks[1:]
    with pytest.raises(ValueError, match="0 or 1"):
        batch_from_proto(msg)
    s = samples[0]
    with pytest.raises(ValueError, match="no policy token"):
        TrainSample(
            prompt_ids=s.prompt_ids,
            response_ids=s.response_ids,
            rollout_logprobs=s.rollout_logprobs,
            reward=0.0,
            group_id=0,
            policy_version=0,
            loss_mask=np.zeros(len(s.response_ids), np.uint8),
        )


def _with_turn_rewards(samples: list[TrainSample]) -> list[TrainSample]:
    """The masked samples with their reward split over their policy runs' last tokens."""
    out = []
    for s in samples:
        assert s.loss_mask is not None
        ends = [
            i
            for i in range(len(s.loss_mask))
            if s.loss_mask[i] == 1 and (i + 1 == len(s.loss_mask) or s.loss_mask[i + 1] == 0)
        ]
        turn = np.zeros(len(s.response_ids), np.float32)
        turn[ends] = s.reward / len(ends)
        turn[ends[-1]] += s.reward - float(turn.sum())
        out.append(
            TrainSample(
                prompt_ids=s.prompt_ids,
                response_ids=s.response_ids,
                rollout_logprobs=s.rollout_logprobs,
                reward=s.reward,
                group_id=s.group_id,
                policy_version=s.policy_version,
                loss_mask=s.loss_mask,
                turn_rewards=turn,
            )
        )
    return out


@pytest.mark.parametrize(("algorithm", "same"), [("grpo", True), ("ppo", False)])
def test_per_turn_rewards(
    tiny_checkpoint: Path, make_samples: Callable[..., Any], algorithm: str, same: bool
) -> None:
    """An outcome estimator sees a trajectory's score, the sum of its turns' rewards: the same
    step as with the sum at the end. GAE sees each turn's reward where the turn ended."""
    masked = _masked(make_samples([1.0, 0.0, 0.3, 0.9, 0.5, 0.0]), -1.0)
    turned = _with_turn_rewards(masked)
    assert any(np.count_nonzero(s.turn_rewards) > 1 for s in turned)
    params = []
    for samples in (masked, turned):
        worker = _worker(tiny_checkpoint, algorithm=algorithm)
        worker.train_step(batch_from_proto(batch_to_proto(samples)))  # across the wire
        params.append(_params(worker))
    gap = max(float((params[0][k] - params[1][k]).abs().max()) for k in params[0])
    assert (gap <= TOL) if same else (gap > 1e-5), gap


def test_turn_rewards_are_checked(make_samples: Callable[..., Any]) -> None:
    s = _with_turn_rewards(_masked(make_samples([0.0, 1.0]), -1.0))[1]
    assert s.loss_mask is not None and s.loss_mask[1] == 0
    fields = dict(
        prompt_ids=s.prompt_ids,
        response_ids=s.response_ids,
        rollout_logprobs=s.rollout_logprobs,
        group_id=0,
        policy_version=0,
        loss_mask=s.loss_mask,
    )
    with pytest.raises(ValueError, match="sum to"):
        TrainSample(reward=2.0, turn_rewards=s.turn_rewards, **fields)
    on_observation = np.zeros(len(s.response_ids), np.float32)
    on_observation[1] = 1.0  # position 1 is an observation token
    with pytest.raises(ValueError, match="did not sample"):
        TrainSample(reward=1.0, turn_rewards=on_observation, **fields)
