"""LearnerWorker on a tiny random Llama, single process: GRPO, PPO, log-probs, bad input."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from hybridflow.services.learner.worker import LearnerWorker
from hybridflow.types import TrainSample
from tests.helpers import learner_config


def _worker(path: Path, **overrides: object) -> LearnerWorker:
    base = {
        "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
        "update": {"micro_batch_size": 4},
    }
    return LearnerWorker(learner_config(base, **overrides), path)


def _params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.full_state_dict_items()}


def test_grpo_step_updates_weights_and_version(tiny_checkpoint: Path, make_samples) -> None:
    worker = _worker(tiny_checkpoint)
    before = _params(worker)
    result = worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0, 0.5, 0.0]))
    assert result.policy_version == 1 == worker.policy_version
    after = _params(worker)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    m = result.metrics
    for key in (
        "actor/pg_loss",
        "actor/entropy",
        "actor/ppo_kl",
        "actor/pg_clipfrac",
        "actor/grad_norm",
        "critic/score/mean",
        "critic/advantages/mean",
        "response_length/mean",
    ):
        assert math.isfinite(m[key]), key
    assert m["actor/grad_norm"] > 0
    # On-policy single update: ratio 1, nothing clipped, no KL to the old policy.
    assert m["actor/pg_clipfrac"] == 0.0
    assert abs(m["actor/ppo_kl"]) < 1e-6
    assert m["critic/score/mean"] == pytest.approx(2.5 / 6)


def test_grpo_pg_loss_is_minus_token_weighted_advantage(
    tiny_checkpoint: Path, make_samples
) -> None:
    # Groups of 2: rewards (1, 0) -> advantages (+.7071, -.7071) per group (std of {0,1} is
    # .7071). With ratio 1 the token-mean loss is -sum_i(adv_i * len_i) / sum_i(len_i).
    samples = make_samples([1.0, 0.0, 0.0, 1.0])
    lengths = [len(s.response_ids) for s in samples]
    a = 0.5 / math.sqrt(0.5)
    adv = [a, -a, -a, a]
    expected = -sum(x * n for x, n in zip(adv, lengths, strict=True)) / sum(lengths)
    result = _worker(tiny_checkpoint).train_step(samples)
    assert result.metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-5)


def test_equal_rewards_give_zero_advantage_and_zero_loss(
    tiny_checkpoint: Path, make_samples
) -> None:
    worker = _worker(tiny_checkpoint)
    result = worker.train_step(make_samples([1.0, 1.0, 0.0, 0.0]))
    assert result.metrics["actor/pg_loss"] == 0.0
    assert result.metrics["critic/advantages/max"] == 0.0
    assert result.metrics["actor/grad_norm"] == 0.0
    assert result.policy_version == 1


@pytest.mark.parametrize(
    "split_by",
    [
        {"update": {"micro_batch_size": 2}},
        # Token budgets (learner.memory) over samples of 5, 8, 11, 6, 9, 7, 7 tokens:
        # 14 gives [5, 8], [11], [6], [9], [7, 7]; 20 gives [5, 8], [11, 6], [9, 7], [7].
        {"memory": LearnerMemoryConfig(max_tokens_per_micro_batch=14)},
        {"memory": LearnerMemoryConfig(max_tokens_per_micro_batch=20, packing=True)},
    ],
    ids=["rows", "tokens", "tokens_packed"],
)
def test_micro_batching_matches_one_big_batch(
    tiny_checkpoint: Path, make_samples, split_by: dict[str, object]
) -> None:
    samples = make_samples([1.0, 0.0, 0.3, 0.9, 0.5, 0.0, 0.2])
    whole = _worker(tiny_checkpoint, update={"micro_batch_size": 16})
    split = _worker(tiny_checkpoint, **split_by)
    m_whole = whole.train_step(samples).metrics
    m_split = split.train_step(samples).metrics
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert m_split[key] == pytest.approx(m_whole[key], abs=1e-5), key
    p_whole, p_split = _params(whole), _params(split)
    for k in p_whole:
        torch.testing.assert_close(p_split[k], p_whole[k], atol=1e-5, rtol=0)


def test_mini_batches_and_epochs_step_once_each(tiny_checkpoint: Path, make_samples) -> None:
    worker = _worker(tiny_checkpoint, update={"num_mini_batches": 2, "epochs": 2})
    assert worker.versions_per_step() == 4  # what its info tells the schedule
    result = worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0]))
    assert result.policy_version == 4
    from hybridflow.services.learner.core import LearnerCore

    assert LearnerCore(worker).schedule_needs().versions_per_step == 4
    # Later updates see a moved policy: the ratio leaves 1.
    assert result.metrics["actor/ppo_kl"] != 0.0


def test_ppo_step_trains_critic(tiny_checkpoint: Path, make_samples) -> None:
    worker = _worker(tiny_checkpoint, algorithm="ppo", advantage={"gamma": 1.0, "lam": 0.95})
    result = worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0, 0.5]))
    m = result.metrics
    assert result.policy_version == 1
    for key in (
        "critic/vf_loss",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/returns/mean",
        "critic/values/mean",
    ):
        assert math.isfinite(m[key]), key
    assert m["critic/vf_loss"] > 0
    # Whitened advantages: mean 0 over the batch's response tokens.
    assert abs(m["critic/advantages/mean"]) < 1e-5
    # One update from the rollout-time critic: predictions equal the stored values.
    assert m["critic/vpred_mean"] == pytest.approx(m["critic/values/mean"], abs=1e-5)
    assert m["critic/vf_clipfrac"] == 0.0


def test_kl_loss_to_reference_starts_at_zero(tiny_checkpoint: Path, make_samples) -> None:
    worker = _worker(tiny_checkpoint, kl={"use_reference": True, "coef": 0.1}, update={"epochs": 2})
    m = worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0])).metrics
    # Epoch 1 has kl 0 (policy == reference), epoch 2 > 0 (k3 >= 0): mean in (0, inf).
    assert m["actor/kl_loss"] > 0
    assert m["actor/kl_coef"] == 0.1


def test_ppo_kl_in_reward(tiny_checkpoint: Path, make_samples) -> None:
    worker = _worker(
        tiny_checkpoint,
        algorithm="ppo",
        kl={"use_reference": True, "coef": 0.1, "mode": "reward", "estimator": "k1"},
    )
    m = worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0])).metrics
    # Before any update the policy equals the reference: zero penalty.
    assert m["actor/reward_kl_penalty"] == 0.0
    assert m["critic/rewards/mean"] == pytest.approx(0.5)


def test_compute_logprobs_matches_manual_log_softmax(tiny_checkpoint: Path) -> None:
    worker = _worker(tiny_checkpoint)
    prompts = [[10, 11, 12], [30, 31, 32, 33, 34], [40]]
    responses = [[20, 21], [22], [23, 24, 25, 26]]
    temperature = 0.7
    got = worker.compute_logprobs(prompts, responses, temperature)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    for p, r, lp in zip(prompts, responses, got, strict=True):
        ids = torch.tensor([p + r])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        logp = torch.log_softmax(logits / temperature, dim=-1)
        manual = [logp[len(p) - 1 + j, tok].item() for j, tok in enumerate(r)]
        assert len(lp) == len(r)
        assert lp == pytest.approx(manual, abs=1e-5)


def test_save_checkpoint_round_trips(tiny_checkpoint: Path, tmp_path: Path, make_samples) -> None:
    worker = _worker(tiny_checkpoint)
    worker.train_step(make_samples([1.0, 0.0]))
    worker.save_checkpoint(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    state = loaded.state_dict()
    items = dict(worker.full_state_dict_items())
    assert set(items) == set(state)
    for name, tensor in items.items():
        torch.testing.assert_close(state[name], tensor, atol=0, rtol=0)
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()


def _bad(samples: list[TrainSample], index: int, **change: object) -> list[TrainSample]:
    for key, value in change.items():
        setattr(samples[index], key, value)
    return samples


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"response_ids": [], "rollout_logprobs": []}, r"samples\[1\]\.response_ids: empty"),
        ({"prompt_ids": []}, r"samples\[1\]\.prompt_ids: empty"),
        (
            {"response_ids": [5, 101], "rollout_logprobs": [0.0, 0.0]},
            r"samples\[1\]\.response_ids: token id 101 outside vocab",
        ),
        ({"prompt_ids": [-1]}, r"samples\[1\]\.prompt_ids: token id -1"),
        ({"reward": float("nan")}, r"samples\[1\]\.reward: not finite"),
        ({"rollout_logprobs": [0.0]}, r"samples\[1\]\.rollout_logprobs"),
        ({"baseline": float("inf")}, r"samples\[1\]\.baseline: not finite"),
    ],
)
def test_bad_input_raises_value_error(
    tiny_checkpoint: Path, make_samples, change: dict[str, object], message: str
) -> None:
    worker = _worker(tiny_checkpoint)
    with pytest.raises(ValueError, match=message):
        worker.train_step(_bad(make_samples([1.0, 0.0, 1.0]), 1, **change))
    assert worker.policy_version == 0


def test_empty_batch_raises(tiny_checkpoint: Path) -> None:
    worker = _worker(tiny_checkpoint)
    with pytest.raises(ValueError, match="batch: no samples"):
        worker.train_step([])
    with pytest.raises(ValueError, match="batch: no samples"):
        worker.compute_logprobs([], [], 1.0)


def test_grpo_raises_likelihood_of_rewarded_response(tiny_checkpoint: Path, make_samples) -> None:
    samples = make_samples([1.0, 0.0])  # one group: sample 0 good, sample 1 bad
    worker = _worker(tiny_checkpoint, optimizer={"lr": 1e-2})
    prompts = [s.prompt_ids for s in samples]
    responses = [s.response_ids for s in samples]
    before = [sum(lp) for lp in worker.compute_logprobs(prompts, responses, 1.0)]
    for _ in range(3):
        worker.train_step(samples)
    after = [sum(lp) for lp in worker.compute_logprobs(prompts, responses, 1.0)]
    assert after[0] > before[0]
    assert after[1] < before[1]


@pytest.mark.parametrize(
    "mode, shift, factor",
    [
        ("none", math.log(2.0), 1.0),
        ("tis", math.log(2.0), 0.5),
        ("tis", -math.log(4.0), 2.0),
        ("decoupled", -math.log(4.0), 4.0),
    ],
)
def test_off_policy_weights_scale_the_policy_loss(
    tiny_checkpoint: Path, make_samples, mode: str, shift: float, factor: float
) -> None:
    # Rollout log-probs = learner log-probs + shift, so pi_prox / pi_behav = exp(-shift) on
    # every token: tis truncates it at is_cap (2.0), decoupled only at 5 * is_cap.
    samples = make_samples([1.0, 0.0, 0.0, 1.0])
    probe = _worker(tiny_checkpoint)
    learner_lps = probe.compute_logprobs(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0
    )
    for s, lps in zip(samples, learner_lps, strict=True):
        s.rollout_logprobs = [lp + shift for lp in lps]
    plain = _worker(tiny_checkpoint).train_step(samples).metrics
    corrected = _worker(tiny_checkpoint, loss={"off_policy": mode}).train_step(samples).metrics
    assert corrected["actor/pg_loss"] == pytest.approx(factor * plain["actor/pg_loss"], rel=1e-4)
    if mode != "none":
        assert corrected["actor/is_weight_mean"] == pytest.approx(factor, rel=1e-4)


@pytest.mark.parametrize(
    ("estimator", "loss"),
    [
        ("rloo", "ppo_clip"),
        ("reinforce_plus_plus", "gspo"),
        ("reinforce_plus_plus_baseline", "cispo"),
        ("dr_grpo", "gspo"),
    ],
)
def test_registered_estimators_and_losses_train(
    tiny_checkpoint: Path, make_samples, estimator: str, loss: str
) -> None:
    worker = _worker(
        tiny_checkpoint, advantage_estimator=estimator, policy_loss=loss, update={"epochs": 2}
    )
    assert worker.critic is None
    before = _params(worker)
    m = worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0])).metrics
    assert all(math.isfinite(v) for v in m.values())
    assert m["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in _params(worker).items())


def test_overlong_shaping_lowers_the_rewards(tiny_checkpoint: Path, make_samples) -> None:
    samples = make_samples([1.0, 1.0, 1.0, 1.0])  # response lengths 2, 4, 6, 3
    worker = _worker(tiny_checkpoint, overlong={"buffer": 2}, max_new_tokens=6)
    m = worker.train_step(samples).metrics
    # Lengths 5..6 fall in the buffer: only the 6-token response, at the limit: -1.
    assert m["actor/overlong_frac"] == pytest.approx(0.25)
    assert m["critic/rewards/mean"] == pytest.approx((4 - 1.0) / 4)
    assert m["critic/score/mean"] == pytest.approx(1.0)


def test_user_estimator_module_and_bad_path(
    tiny_checkpoint: Path, make_samples, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "learner_user_algos.py").write_text(
        "def estimate(inputs, options):\n"
        "    adv = (inputs.token_rewards.sum(-1) - 0.5).unsqueeze(-1) * inputs.response_mask\n"
        "    return adv, adv\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    worker = _worker(tiny_checkpoint, advantage_estimator="learner_user_algos:estimate")
    m = worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0])).metrics
    assert m["critic/advantages/max"] == pytest.approx(0.5)
    assert m["critic/advantages/min"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match=r"learner\.advantage_estimator: .*has no attribute"):
        _worker(tiny_checkpoint, advantage_estimator="learner_user_algos:nope")


def test_remax_step_advantages_are_reward_minus_greedy_baseline(
    tiny_model_path: Path, make_samples
) -> None:
    from hybridflow.services.learner.core import LearnerCore

    rewards, baselines = [1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.25, 0.25]
    samples = [
        replace(s, baseline=b) for s, b in zip(make_samples(rewards), baselines, strict=True)
    ]
    lengths = [len(s.response_ids) for s in samples]  # 2, 4, 6, 3
    worker = _worker(tiny_model_path, advantage_estimator="remax")
    assert LearnerCore(worker).needs_greedy_baseline()
    assert not LearnerCore(_worker(tiny_model_path)).needs_greedy_baseline()
    m = worker.train_step(samples).metrics
    token_mean = sum(
        (r - b) * n for r, b, n in zip(rewards, baselines, lengths, strict=True)
    ) / sum(lengths)  # (1 - 2 - 1.5 + 2.25) / 15: no group statistic enters
    assert m["critic/advantages/mean"] == pytest.approx(token_mean, abs=1e-6)
    assert m["critic/advantages/max"] == 0.75 and m["critic/advantages/min"] == -0.5
    with pytest.raises(ValueError, match="advantage estimator 'remax' needs a greedy baseline"):
        worker.train_step(make_samples(rewards))


def test_the_optimizers_hold_their_state_before_the_first_step(tiny_checkpoint: Path) -> None:
    # optim_layout: AdamW's moments allocated when the worker is built, not in its first step
    worker = _worker(tiny_checkpoint, algorithm="ppo", advantage={"gamma": 1.0, "lam": 0.95})
    assert worker.critic_optim is not None
    for optim in (worker.actor_optim, worker.critic_optim):
        trained = [p for g in optim.param_groups for p in g["params"] if p.requires_grad]
        assert trained and all(float(optim.state[p]["step"]) == 0.0 for p in trained)
        assert all(optim.state[p]["exp_avg_sq"].shape == p.shape for p in trained)
