"""Registered estimators and policy losses against hand-computed examples; name resolution."""

from __future__ import annotations

import math
import statistics
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hybridflow.algorithms.overlong import overlong_penalty
from hybridflow.algorithms.policy_loss import PolicyLossOutput, compute_policy_loss
from hybridflow.algorithms.registry import (
    BUILTIN_ADVANTAGE_ESTIMATORS,
    BUILTIN_POLICY_LOSSES,
    AdvantageInputs,
    AdvantageOptions,
    PolicyLossInputs,
    PolicyLossOptions,
    as_policy_loss_output,
    resolve_advantage_estimator,
    resolve_policy_loss,
)
from hybridflow.services.learner.config import ADVANTAGE_ESTIMATOR_NAMES, POLICY_LOSS_NAMES

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])


def _outcome_inputs(scores: list[float], groups: list[int]) -> AdvantageInputs:
    mask = MASK[: len(scores)]
    rewards = torch.zeros_like(mask)
    for row, score in enumerate(scores):
        rewards[row, int(mask[row].sum()) - 1] = score
    return AdvantageInputs(rewards, mask, torch.tensor(groups), None)


def _estimate(name: str, inputs: AdvantageInputs, **options: float) -> torch.Tensor:
    adv, _ = resolve_advantage_estimator(name).fn(inputs, AdvantageOptions(**options))  # type: ignore[arg-type]
    return adv


def _whiten(token_values: list[float]) -> list[float]:
    mean, var = statistics.fmean(token_values), statistics.variance(token_values)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in token_values]


def _valid(t: torch.Tensor, mask: torch.Tensor = MASK) -> list[float]:
    return t[mask[: t.shape[0]] > 0].tolist()


def test_config_names_mirror_the_registry() -> None:
    assert set(ADVANTAGE_ESTIMATOR_NAMES) == set(BUILTIN_ADVANTAGE_ESTIMATORS)
    assert set(POLICY_LOSS_NAMES) == set(BUILTIN_POLICY_LOSSES)


def test_grpo_and_dr_grpo() -> None:
    inputs = _outcome_inputs([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group 0: mean 0.5, unbiased std sqrt(0.5)
    assert _valid(_estimate("grpo", inputs)) == pytest.approx([a] * 3 + [-a] * 2 + [0.0] * 3)
    expected_dr = [0.5] * 3 + [-0.5] * 2 + [0.0] * 3
    assert _valid(_estimate("dr_grpo", inputs)) == pytest.approx(expected_dr)
    no_std = _estimate("grpo", inputs, norm_adv_by_std=False)
    assert _valid(no_std) == pytest.approx(expected_dr)


def test_rloo_leave_one_out_baseline() -> None:
    # Group 0 = (1, 0, 0): 1 - 0 = 1, 0 - 0.5 = -0.5 (twice); group 1 is a singleton: its score.
    inputs = _outcome_inputs([1.0, 0.0, 0.0, 0.5], [0, 0, 0, 1])
    adv = _estimate("rloo", inputs)
    assert _valid(adv) == pytest.approx([1.0] * 3 + [-0.5] * 2 + [-0.5] + [0.5] * 2)


def test_reinforce_plus_plus_discounted_returns_whitened_over_tokens() -> None:
    mask = MASK[:2]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    inputs = AdvantageInputs(rewards, mask, torch.tensor([0, 0]), None)
    fn = resolve_advantage_estimator("reinforce_plus_plus").fn
    adv, returns = fn(inputs, AdvantageOptions(gamma=0.5))
    # Row 0: 0.25, 0.5, 1; row 1: 1, 2 (the return resets at the end of each response).
    assert _valid(returns, mask) == pytest.approx([0.25, 0.5, 1.0, 1.0, 2.0])
    assert _valid(adv, mask) == pytest.approx(_whiten([0.25, 0.5, 1.0, 1.0, 2.0]), abs=1e-6)
    assert adv[1, 2] == 0.0


def test_reinforce_plus_plus_baseline() -> None:
    # Centred scores 0.5, -0.5 (group 0), 1, -1 (group 1) spread over 3, 2, 1, 2 tokens.
    inputs = _outcome_inputs([1.0, 0.0, 3.0, 1.0], [0, 0, 1, 1])
    tokens = [0.5] * 3 + [-0.5] * 2 + [1.0] + [-1.0] * 2
    assert _valid(_estimate("reinforce_plus_plus_baseline", inputs)) == pytest.approx(
        _whiten(tokens), abs=1e-6
    )


def test_remax_is_score_minus_greedy_baseline_on_every_token() -> None:
    # Scores 1, 0, 1, 0.5 over 3, 2, 1, 2 tokens; greedy baselines 0.5, 0.5, 0.25, 0.25.
    scores, baselines = [1.0, 0.0, 1.0, 0.5], torch.tensor([0.5, 0.5, 0.25, 0.25])
    estimator = resolve_advantage_estimator("remax")
    assert estimator.needs_baseline and not estimator.needs_critic
    expected = [0.5] * 3 + [-0.5] * 2 + [0.75] + [0.25] * 2
    for groups in ([0, 0, 1, 1], [0, 0, 0, 0], [0, 1, 2, 3]):  # group statistics play no part
        inputs = replace(_outcome_inputs(scores, groups), baselines=baselines)
        adv, returns = estimator.fn(inputs, AdvantageOptions())
        assert _valid(adv) == expected  # exact: every value is a binary fraction
        assert _valid(returns) == [1.0] * 3 + [0.0] * 2 + [1.0] + [0.5] * 2
        assert adv[MASK == 0].tolist() == [0.0] * 4


def test_remax_per_token_rewards_use_the_reward_to_go() -> None:
    # As verl: returns are the reward-to-go (KL-in-reward shapes every token), minus baseline.
    rewards = torch.tensor([[0.25, -0.5, 1.0], [0.5, 1.0, 0.0]])
    inputs = AdvantageInputs(
        rewards, MASK[:2], torch.tensor([0, 0]), None, torch.tensor([0.5, 1.0])
    )
    adv, returns = resolve_advantage_estimator("remax").fn(inputs, AdvantageOptions())
    assert returns.tolist() == [[0.75, 0.5, 1.0], [1.5, 1.0, 0.0]]
    assert adv.tolist() == [[0.25, 0.0, 0.5], [0.5, 0.0, 0.0]]


def test_remax_without_baselines_raises() -> None:
    with pytest.raises(ValueError, match="'remax' needs the greedy baselines"):
        _estimate("remax", _outcome_inputs([1.0, 0.0], [0, 0]))


def test_gae_through_the_registry_whitens_gae() -> None:
    inputs = _outcome_inputs([1.0, 0.0], [0, 0])
    inputs = AdvantageInputs(
        inputs.token_rewards, inputs.response_mask, inputs.group_ids, torch.zeros(2, 3)
    )
    estimator = resolve_advantage_estimator("gae")
    assert estimator.needs_critic
    adv, returns = estimator.fn(inputs, AdvantageOptions(gamma=1.0, lam=1.0))
    # Zero values, gamma = lam = 1: every token's advantage and return is its score.
    assert _valid(returns, MASK[:2]) == pytest.approx([1.0] * 3 + [0.0] * 2)
    assert _valid(adv, MASK[:2]) == pytest.approx(_whiten([1.0] * 3 + [0.0] * 2), abs=1e-6)


def _loss_inputs(old: list[list[float]], new: torch.Tensor, adv: list[list[float]], **kw):  # type: ignore[no-untyped-def]
    return PolicyLossInputs(
        torch.tensor(old), new, torch.tensor(adv), torch.ones(len(old), len(old[0])), **kw
    )


def test_ppo_clip_is_compute_policy_loss() -> None:
    old = [[-1.0, -0.5], [-0.2, -2.0]]
    new = torch.tensor([[-0.7, -0.6], [-0.1, -2.5]])
    adv = [[1.0, 1.0], [-1.0, -1.0]]
    opts = PolicyLossOptions(0.2, 0.28, 3.0, "seq-mean-token-sum")
    got = as_policy_loss_output(resolve_policy_loss("ppo_clip")(_loss_inputs(old, new, adv), opts))
    want = compute_policy_loss(
        torch.tensor(old), new, torch.tensor(adv), torch.ones(2, 2), 0.2, 0.28, 3.0,
        "seq-mean-token-sum",
    )  # fmt: skip
    assert float(got.loss) == pytest.approx(float(want.loss))
    assert float(got.pg_clipfrac) == pytest.approx(float(want.pg_clipfrac))


def test_gspo_sequence_ratio_hand_computed() -> None:
    # Seq 0: mean log-ratio 0.2, s = e^0.2 = 1.2214 > 1.2 with A = +1: clipped to -1.2 (no grad).
    # Seq 1: s = e^-0.1 = 0.9048 inside the clip with A = -1: loss 0.9048 per token.
    new = torch.tensor([[0.1, 0.3], [-0.1, -0.1]], requires_grad=True)
    inputs = _loss_inputs([[0.0, 0.0], [0.0, 0.0]], new, [[1.0, 1.0], [-1.0, -1.0]])
    out = as_policy_loss_output(resolve_policy_loss("gspo")(inputs, PolicyLossOptions(0.2, 0.2)))
    s1 = math.exp(-0.1)
    assert out.loss.item() == pytest.approx((-1.2 + s1) / 2)
    out.loss.backward()
    assert new.grad is not None
    # seq-mean-token-mean: d/dlogp_t = 1/2 (seqs) * 1/2 (tokens) * (-A) * s.
    assert new.grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.25 * s1, 0.25 * s1])
    assert float(out.pg_clipfrac) == pytest.approx(0.5)
    assert float(out.ppo_kl) == pytest.approx(-(0.1 + 0.3 - 0.2) / 4)


def test_gspo_is_additive_over_micro_batches_with_global_normalisers() -> None:
    old = torch.tensor([[-1.0, -0.5, -0.3], [-0.2, -2.0, -1.0]])
    new = torch.tensor([[-0.7, -0.6, -0.2], [-0.1, -2.5, -1.1]])
    adv = torch.tensor([[1.0] * 3, [-0.5] * 3])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    fn, opts = resolve_policy_loss("gspo"), PolicyLossOptions(0.2, 0.28)
    full = as_policy_loss_output(fn(PolicyLossInputs(old, new, adv, mask), opts)).loss
    parts = sum(
        float(as_policy_loss_output(
            fn(PolicyLossInputs(old[i : i + 1], new[i : i + 1], adv[i : i + 1], mask[i : i + 1],
                                num_tokens=5.0, num_seqs=2.0), opts)
        ).loss)
        for i in range(2)
    )  # fmt: skip
    assert parts == pytest.approx(float(full))


def test_cispo_clipped_detached_weight_hand_computed() -> None:
    # Ratios e^0.5 = 1.6487 -> clipped to 1.28, e^-0.1 = 0.9048 (kept); A = 1, token-mean.
    new = torch.tensor([[0.5, -0.1]], requires_grad=True)
    inputs = _loss_inputs([[0.0, 0.0]], new, [[1.0, 1.0]])
    out = as_policy_loss_output(resolve_policy_loss("cispo")(inputs, PolicyLossOptions(0.2, 0.28)))
    w1 = math.exp(-0.1)
    assert out.loss.item() == pytest.approx(-(1.28 * 0.5 + w1 * -0.1) / 2)
    out.loss.backward()
    assert new.grad is not None
    assert new.grad.flatten().tolist() == pytest.approx([-1.28 / 2, -w1 / 2])
    assert float(out.pg_clipfrac) == pytest.approx(0.5)


def test_overlong_penalty_hand_computed() -> None:
    # max 10, buffer 4: no penalty up to 6 tokens, then -1/4 per token down to -1 at 10.
    got = overlong_penalty(torch.tensor([5, 6, 7, 10]), 10, 4, 1.0)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.25, -1.0])
    assert overlong_penalty(torch.tensor([8]), 10, 4, 0.5).tolist() == pytest.approx([-0.25])
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(torch.tensor([1]), 4, 5, 1.0)


def test_bare_tensor_loss_and_bad_return() -> None:
    out = as_policy_loss_output(torch.tensor(2.0))
    assert isinstance(out, PolicyLossOutput) and float(out.ppo_kl) == 0.0
    with pytest.raises(ValueError, match="expected PolicyLossOutput"):
        as_policy_loss_output((1, 2))  # type: ignore[arg-type]


USER_MODULE = textwrap.dedent(
    """
    def centred(inputs, options):
        scores = inputs.token_rewards.sum(-1)
        adv = (scores - scores.mean()).unsqueeze(-1) * inputs.response_mask
        return adv, adv

    def one_arg(inputs):
        return inputs

    def reinforce(inputs, options):
        return -(inputs.advantages * inputs.logprob * inputs.response_mask).sum() / inputs.num_tokens

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_algos_mod.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_algos_mod"


def test_user_estimator_and_loss_by_import_path(user_module: str) -> None:
    estimator = resolve_advantage_estimator(f"{user_module}:centred")
    assert not estimator.needs_critic and not estimator.needs_baseline
    adv = _estimate(f"{user_module}:centred", _outcome_inputs([1.0, 0.0], [0, 0]))
    assert _valid(adv, MASK[:2]) == pytest.approx([0.5] * 3 + [-0.5] * 2)
    loss = resolve_policy_loss(f"{user_module}:reinforce")
    new = torch.tensor([[-1.0, -2.0]])
    out = as_policy_loss_output(
        loss(_loss_inputs([[0.0, 0.0]], new, [[1.0, 1.0]], num_tokens=2.0), PolicyLossOptions())
    )
    assert float(out.loss) == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (":one_arg", "must accept (inputs, options)"),
        (":missing", "has no attribute 'missing'"),
        (":NOT_CALLABLE", "is not callable"),
    ],
)
def test_bad_user_paths_name_the_key(user_module: str, suffix: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^learner\.advantage_estimator: ") as err:
        resolve_advantage_estimator(user_module + suffix)
    assert message in str(err.value)
    with pytest.raises(ValueError, match=r"^learner\.policy_loss: ") as err:
        resolve_policy_loss(user_module + suffix)
    assert message in str(err.value)


def test_unknown_names_and_modules() -> None:
    with pytest.raises(ValueError, match="learner.advantage_estimator: unknown estimator 'rlo'"):
        resolve_advantage_estimator("rlo")
    with pytest.raises(ValueError, match="learner.policy_loss: unknown policy loss"):
        resolve_policy_loss("ppo")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_xyz'"):
        resolve_advantage_estimator("no_such_module_xyz:f")
