"""The tenant engine on the tiny model: losses as Tinker defines them (sums over tokens), each
tenant's adapter and optimizer its own (interleaved tenants follow their solo curves, a fresh
tenant is the base model), and bad calls refused by name with nothing changed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.errors import BadRequest
from hybridflow.models import resolve_model_path
from hybridflow.services.learner.tenants import (
    AdamParams,
    AdapterSpec,
    Datum,
    TenantError,
    TenantTrainer,
)

ADAM = AdamParams(learning_rate=1e-2)


@pytest.fixture(scope="module")
def qwen3_path() -> Path:
    return resolve_model_path("builtin:tiny-qwen3")


def _trainer(path: Path, max_tenants: int = 4) -> TenantTrainer:
    return TenantTrainer(AutoModelForCausalLM.from_pretrained(path).eval(), max_tenants)


def _datums(seed: int, lengths: tuple[int, ...] = (6, 9)) -> list[Datum]:
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        out.append(
            Datum(
                tokens=rng.integers(0, 200, n).astype(np.int32),
                inputs={
                    "target_tokens": rng.integers(0, 200, n),
                    "weights": rng.uniform(0, 1, n).astype(np.float32),
                },
            )
        )
    return out


def _base_logprobs(path: Path, datum: Datum) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(datum.tokens.astype(np.int64))[None]).logits
    lp = torch.log_softmax(logits[0].float(), -1)
    return lp.gather(-1, torch.from_numpy(datum.inputs["target_tokens"])[:, None])[:, 0]


def test_cross_entropy_is_the_weighted_sum_over_tokens_and_a_fresh_tenant_is_the_base(
    qwen3_path: Path,
) -> None:
    trainer = _trainer(qwen3_path)
    trainer.create("a", AdapterSpec(rank=4, seed=1))
    datums = _datums(0)
    logprobs, metrics = trainer.forward_backward("a", datums, "cross_entropy", forward_only=True)
    expected = 0.0
    for datum, got in zip(datums, logprobs, strict=True):
        base = _base_logprobs(qwen3_path, datum)
        np.testing.assert_allclose(got, base.numpy(), rtol=1e-5, atol=1e-5)
        expected -= float((base * torch.from_numpy(datum.inputs["weights"])).sum())
    assert metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)


def test_importance_sampling_and_ppo_at_ratio_one_are_minus_the_advantage_sum(
    qwen3_path: Path,
) -> None:
    trainer = _trainer(qwen3_path)
    trainer.create("a", AdapterSpec(rank=4))
    (datum,) = _datums(1, (7,))
    logprobs, _ = trainer.forward_backward("a", [datum], "cross_entropy", forward_only=True)
    advantages = np.linspace(-1, 2, 7).astype(np.float32)
    rl = Datum(
        tokens=datum.tokens,
        inputs={
            "target_tokens": datum.inputs["target_tokens"],
            "logprobs": logprobs[0],
            "advantages": advantages,
        },
    )
    for loss_fn in ("importance_sampling", "ppo"):
        _, metrics = trainer.forward_backward("a", [rl], loss_fn, forward_only=True)
        assert metrics["loss:sum"] == pytest.approx(-float(advantages.sum()), abs=1e-4)


def test_ppo_clips_the_ratio_at_its_thresholds(qwen3_path: Path) -> None:
    trainer = _trainer(qwen3_path)
    trainer.create("a", AdapterSpec(rank=4))
    (datum,) = _datums(2, (5,))
    logprobs, _ = trainer.forward_backward("a", [datum], "cross_entropy", forward_only=True)
    # the sampler's log-probs 1 lower: ratio e (2.72) on every token, positive advantages
    rl = Datum(
        tokens=datum.tokens,
        inputs={
            "target_tokens": datum.inputs["target_tokens"],
            "logprobs": logprobs[0] - 1.0,
            "advantages": np.ones(5, np.float32),
        },
    )
    _, plain = trainer.forward_backward("a", [rl], "importance_sampling", forward_only=True)
    _, clipped = trainer.forward_backward(
        "a", [rl], "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, True
    )
    assert plain["loss:sum"] == pytest.approx(-5 * np.e, rel=1e-4)
    assert clipped["loss:sum"] == pytest.approx(-5 * 1.1, rel=1e-5)


def _curve(trainer: TenantTrainer, name: str, seed: int, steps: int) -> list[float]:
    losses = []
    for step in range(steps):
        _, metrics = trainer.forward_backward(name, _datums(seed + step), "cross_entropy")
        trainer.optim_step(name, ADAM)
        losses.append(metrics["loss:sum"])
    return losses


def test_interleaved_tenants_follow_their_solo_curves(qwen3_path: Path) -> None:
    solo = _trainer(qwen3_path)
    solo.create("a", AdapterSpec(rank=4, seed=11))
    alone = _curve(solo, "a", seed=100, steps=3)
    assert alone[-1] < alone[0]  # it learns

    shared = _trainer(qwen3_path)
    shared.create("b", AdapterSpec(rank=8, seed=22))
    shared.create("a", AdapterSpec(rank=4, seed=11))
    together = []
    for step in range(3):
        # b's gradients and steps land between a's calls
        _, metrics = shared.forward_backward("a", _datums(100 + step), "cross_entropy")
        shared.forward_backward("b", _datums(500 + step), "cross_entropy")
        shared.optim_step("b", ADAM)
        shared.optim_step("a", ADAM)
        together.append(metrics["loss:sum"])
    np.testing.assert_allclose(together, alone, rtol=1e-5)
    assert (shared.steps("a"), shared.steps("b")) == (3, 3)
    # a new tenant still starts as the base, whatever the others learnt
    shared.create("c", AdapterSpec(rank=4))
    (datum,) = _datums(7, (6,))
    fresh, _ = shared.forward_backward("c", [datum], "cross_entropy", forward_only=True)
    np.testing.assert_allclose(fresh[0], _base_logprobs(qwen3_path, datum).numpy(), atol=1e-5)


def test_bad_calls_are_refused_by_name_and_change_nothing(qwen3_path: Path) -> None:
    trainer = _trainer(qwen3_path, max_tenants=1)
    trainer.create("a", AdapterSpec(rank=4))
    with pytest.raises(TenantError, match="at most 1 tenants"):
        trainer.create("b", AdapterSpec(rank=4))
    with pytest.raises(TenantError, match="exists"):
        trainer.create("a", AdapterSpec(rank=4))
    with pytest.raises(TenantError, match="no tenant 'zz'"):
        trainer.forward_backward("zz", _datums(0), "cross_entropy")
    with pytest.raises(TenantError, match="loss_fn 'gspo' is not served"):
        trainer.forward_backward("a", _datums(0), "gspo")
    (good,) = _datums(3, (4,))
    short = Datum(good.tokens, {"target_tokens": good.inputs["target_tokens"][:3]})
    with pytest.raises(TenantError, match="has shape \\(3,\\), the tokens' is \\(4,\\)"):
        trainer.forward_backward("a", [short], "cross_entropy")
    huge = Datum(good.tokens, {"target_tokens": np.full(4, 10**6)})
    with pytest.raises(TenantError, match="target_tokens holds ids outside"):
        trainer.forward_backward("a", [huge], "cross_entropy")
    no_adv = Datum(good.tokens, {"target_tokens": good.inputs["target_tokens"]})
    with pytest.raises(TenantError, match="needs loss_fn_inputs\\['logprobs'\\]"):
        trainer.forward_backward("a", [no_adv], "ppo")
    with pytest.raises(BadRequest, match="dro needs loss_fn_config\\['beta'\\]"):
        rl = {"logprobs": np.zeros(4, np.float32), "advantages": np.ones(4, np.float32)}
        trainer.forward_backward("a", [Datum(good.tokens, {**no_adv.inputs, **rl})], "dro")
    with pytest.raises(TenantError, match="beta2 must be in"):
        trainer.optim_step("a", AdamParams(beta2=1.0))
    assert trainer.steps("a") == 0
    assert all(p.grad is None for p in trainer.model.parameters())
    trainer.drop("a")  # its place is free again, and its adapter gone from the model
    assert not any(".a." in n for n, _ in trainer.model.named_parameters())
    trainer.create("b", AdapterSpec(rank=4))


def test_one_batch_samples_each_row_with_its_own_adapter(qwen3_path: Path) -> None:
    """Two tenants trained apart, frozen as sampling adapters: one greedy batch of rows for
    the first, the second and the base gives each row what sampling with that adapter alone
    gives (tokens, and log-probs within float noise), and the adapters do differ."""
    from hybridflow.services.tinker.sampler import SampleParams, SampleRequest, sample_many

    trainer = _trainer(qwen3_path)
    for name, seed in (("a", 1), ("b", 2)):
        trainer.create(name, AdapterSpec(rank=4, seed=seed))
        for _ in range(3):
            trainer.forward_backward(name, _datums(seed), "cross_entropy")
            trainer.optim_step(name, AdamParams(learning_rate=5e-2))
        trainer.add_frozen(f"frozen-{name}", trainer.state(name, optimizer=False))
    prompt = np.array([5, 17, 9, 30, 2])
    params = SampleParams(max_tokens=5, temperature=0, eos=False)
    requests = [SampleRequest(prompt, 2, params), SampleRequest(prompt[:3], 1, params)]
    adapters = ["frozen-a", "frozen-b", None]
    rows = [a for a in adapters for r in requests for _ in range(r.num_samples)]
    with trainer.using_by_row(rows):
        mixed = sample_many(trainer.model, requests * 3, set(), str)
    alone = {}
    for i, adapter in enumerate(adapters):
        with trainer.using(adapter):
            alone[adapter] = sample_many(trainer.model, requests, set(), str)
        for together, single in zip(mixed[2 * i : 2 * i + 2], alone[adapter], strict=True):
            assert [c.tokens for c in together] == [c.tokens for c in single]
            for x, y in zip(together, single, strict=True):
                np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
    firsts = {a: alone[a][0][0].logprobs[0] for a in adapters}
    assert len({round(v, 3) for v in firsts.values()}) == 3, firsts  # three models, not one
