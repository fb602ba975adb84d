"""The engine contract (``hybridflow/services/rollout/engine_contract.py``), one suite run over
every engine in the registry on the built-in tiny model: well-formed completions, log-probs
equal to a full forward, weight loads that take effect with their version, weights arriving
mid-request with per-token versions, first tokens drawn from the model's distribution
(a chi-square goodness-of-fit test) with EOS ending a completion and kept in it,
cancellation, and every member of the contract present (a live engine is not dead, its death
callback waits; ``close`` ends it after the module).

An engine is built once per module through ``build_engine`` (the vllm engine starts its
worker process once). The order of events is fixed by the engine's ``between_steps`` and
``should_stop`` hooks, never by timing. A new engine passes this suite by adding its name to
``ENGINE_NAMES``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.services.rollout.config import RolloutConfig
from hybridflow.services.rollout.engine_contract import Engine
from hybridflow.services.rollout.engines import ENGINES, build_engine
from hybridflow.services.rollout.local import LocalRollout
from hybridflow.services.rollout.requests import Cancelled
from hybridflow.types import Completion, SamplingParams
from tests.goodness_of_fit import P_ACCEPT, P_REJECT, counts_of, goodness_of_fit, intended

ENGINE_NAMES = ["hf", "vllm"]
LEAKY = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")
PROMPTS = ["3+4=", "12+7=", "5+5=", "hello "]
FIT_PROMPTS = ["12+7=", "3+4=7"]  # first tokens spread over digits; EOS next (0.89 at T=2)
FIT_DRAWS = 1500


def test_the_suite_covers_every_registered_engine() -> None:
    assert sorted(ENGINE_NAMES) == sorted(ENGINES)


@pytest.fixture(scope="module", params=ENGINE_NAMES)
def engine(request: pytest.FixtureRequest, tiny_model_path: Path) -> Iterator[Any]:
    before = {k: os.environ.get(k) for k in LEAKY}
    eng = build_engine(RolloutConfig(engine=request.param, seed=0), tiny_model_path)
    # What an engine reads while building must not leak into processes started later (a
    # service spawned afterwards with TP 2 would inherit a one-core binding).
    assert {k: os.environ.get(k) for k in LEAKY} == before
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(tiny_model_path: Path) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    return [tok.encode(p, add_special_tokens=False) for p in PROMPTS]


def full_forward_logprobs(
    model: torch.nn.Module, prompt: list[int], response: list[int], temperature: float
) -> list[float]:
    """No cache, one sequence: how the learner recomputes a response's log-probs."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(response)]


def check_well_formed(c: Completion, max_new_tokens: int, stops: set[int], vocab: int) -> None:
    ids = c.token_ids.tolist()
    assert 1 <= len(ids) == len(c.logprobs) <= max_new_tokens
    assert all(0 <= t < vocab for t in ids) and all(lp <= 0 for lp in c.logprobs)
    assert not stops & set(ids[:-1])  # nothing is generated after a stop token
    if c.finish_reason == "stop":
        assert ids[-1] in stops
    else:
        assert c.finish_reason == "length"
        assert len(ids) == max_new_tokens and ids[-1] not in stops


def test_every_member_of_the_contract_is_there_and_a_live_engine_is_not_dead(engine) -> None:
    """Callers never test for a member (``hasattr``): each engine has them all, ``close``
    and ``on_dead`` included. A live engine reports no death and keeps its death callback
    uncalled while it serves."""
    assert isinstance(engine, Engine)
    deaths: list[str] = []
    engine.on_dead(deaths.append)
    assert engine.dead_reason is None
    assert len(engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))[0]) == 1
    assert engine.dead_reason is None and deaths == []


def test_completions_are_well_formed_and_carry_the_version(engine, prompts) -> None:
    stop = prompts[0][0]  # "3": a token the model often writes
    stops = {stop, engine.eos_token_id}
    reasons = set()
    for max_new in (2, 5):  # "19<eos>" is cut at 2 tokens; most answers end by 5
        params = SamplingParams(max_new_tokens=max_new, n=3, seed=2, stop_token_ids=(stop,))
        groups = engine.generate(prompts, params)
        assert [len(g) for g in groups] == [3] * len(prompts)
        for c in (c for g in groups for c in g):
            check_well_formed(c, max_new, stops, engine.vocab_size)
            assert c.policy_version == engine.policy_version
            reasons.add(c.finish_reason)
    assert reasons == {"stop", "length"}
    assert engine.generate([], SamplingParams()) == []


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_full_forward(engine, prompts, reference, temperature) -> None:
    params = SamplingParams(temperature=temperature, max_new_tokens=5, n=3, seed=11)
    groups = engine.generate(prompts, params)
    worst = max(
        abs(got - want)
        for prompt, group in zip(prompts, groups, strict=True)
        for c in group
        for got, want in zip(
            c.logprobs, full_forward_logprobs(reference, prompt, c.token_ids.tolist(), temperature)
        )
    )
    assert worst < 1e-4


@pytest.mark.parametrize("temperature", [2.0, pytest.param(1.0, marks=pytest.mark.slow)])
def test_first_tokens_fit_the_model_distribution_and_stop_at_eos(
    engine, reference, tiny_model_path, temperature
) -> None:
    """Seeded draws of the first token fit softmax(logits / T) of the reference forward
    (chi-square p > 1e-3). After "3+4=7" EOS is likely: a completion that draws it is
    exactly [EOS], finish_reason "stop", with EOS's tempered log-prob (the contract keeps
    EOS). Measured figures: docs/trl-parity.md ("The sampler")."""
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    fit_prompts = [tok.encode(p, add_special_tokens=False) for p in FIT_PROMPTS]
    eos = engine.eos_token_id
    params = SamplingParams(temperature=temperature, max_new_tokens=2, n=FIT_DRAWS, seed=21)
    groups = engine.generate(fit_prompts, params)
    for prompt, group in zip(fit_prompts, groups, strict=True):
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([prompt])).logits[0, -1].double()
        exact = intended(logits.numpy(), temperature, 1.0)
        first = counts_of([int(c.token_ids[0]) for c in group], engine.vocab_size)
        fit = goodness_of_fit(first, exact)
        assert fit.p_value > P_ACCEPT, (tok.decode(prompt), fit)
        eos_logprob = math.log(float(exact[eos]))
        for c in group:
            check_well_formed(c, 2, {eos}, engine.vocab_size)
            if int(c.token_ids[0]) == eos:
                assert c.token_ids.tolist() == [eos] and c.finish_reason == "stop"
                assert abs(c.logprobs[0] - eos_logprob) < 1e-4
    assert first[eos] > FIT_DRAWS / 2  # the EOS prompt did stop most completions at once


REFUSES_TRUNCATION = {"vllm"}
"""Engines whose library reports log-probs after top-k / top-p truncation: they refuse both."""


def test_top_k_truncates_the_draw_not_the_logprob_or_is_refused(
    engine, reference, tiny_model_path, request: pytest.FixtureRequest
) -> None:
    """First tokens with top-k 4 (T = 2) fit the reference's softmax(logits / T) cut to its 4
    most likely tokens, renormalised, and each log-prob is the untruncated tempered one
    (``tests/unit/rollout/test_sampler_fit.py`` checks the sampler itself, with top-p too).
    An engine that cannot report log-probs that way refuses top_k > 0 and top_p < 1 by name."""
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    prompt = tok.encode(FIT_PROMPTS[0], add_special_tokens=False)
    params = SamplingParams(temperature=2.0, top_k=4, max_new_tokens=1, n=FIT_DRAWS, seed=23)
    if request.node.callspec.params["engine"] in REFUSES_TRUNCATION:
        with pytest.raises(ValueError, match=r"sampling\.top_k > 0 is not supported"):
            engine.generate([prompt], params)
        with pytest.raises(ValueError, match=r"sampling\.top_p < 1 is not supported"):
            engine.generate([prompt], SamplingParams(top_p=0.9))
        assert len(engine.generate([prompt], SamplingParams(max_new_tokens=1))[0]) == 1
        return
    (group,) = engine.generate([prompt], params)
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    exact = intended(logits.numpy(), 2.0, 1.0, top_k=4)
    first = counts_of([int(c.token_ids[0]) for c in group], engine.vocab_size)
    fit = goodness_of_fit(first, exact)
    assert fit.p_value > P_ACCEPT, fit
    assert int((first > 0).sum()) == 4  # all four drawn, nothing else
    near = [goodness_of_fit(first, intended(logits.numpy(), 2.0, 1.0, top_k=k)) for k in (3, 5)]
    assert all(miss.p_value < P_REJECT for miss in near), near  # the same draws tell k apart
    print(f"top_k 4: {fit}; top_k 3: {near[0]}; top_k 5: {near[1]}")
    untruncated = torch.log_softmax(logits / 2.0, dim=-1)
    assert max(abs(c.logprobs[0] - float(untruncated[c.token_ids[0]])) for c in group) < 1e-4


def test_loaded_weights_take_effect_with_their_version(engine, prompts, reference) -> None:
    original = [(n, p.detach().clone()) for n, p in reference.named_parameters()]
    scaled = [(n, p * 1.5) for n, p in original]
    other = AutoModelForCausalLM.from_config(reference.config).eval()
    other.load_state_dict(dict(scaled), strict=False)
    other.tie_weights()
    try:
        engine.load_weights(scaled, 7)
        assert engine.policy_version == 7
        (group,) = engine.generate(prompts[:1], SamplingParams(max_new_tokens=4, n=2, seed=4))
        for c in group:
            assert c.policy_version == 7
            want = full_forward_logprobs(other, prompts[0], c.token_ids.tolist(), 1.0)
            assert max(abs(a - b) for a, b in zip(c.logprobs, want)) < 1e-4
            old = full_forward_logprobs(reference, prompts[0], c.token_ids.tolist(), 1.0)
            assert max(abs(a - b) for a, b in zip(c.logprobs, old)) > 1e-3
    finally:
        engine.load_weights(original, 0)


def test_weights_arriving_mid_request_continue_with_per_token_versions(engine, reference) -> None:
    original = [(n, p.detach().clone()) for n, p in reference.named_parameters()]
    zeros = [(n, torch.zeros_like(p)) for n, p in original]
    rollout = LocalRollout(engine, "tiny", in_flight_weights="continue_new")
    try:
        params = SamplingParams(n=4, max_new_tokens=4, seed=1)
        before = rollout.generate([[5, 6, 7]], params)
        take = engine.between_steps
        calls: list[int] = []

        def arrives_after_first_token():
            calls.append(1)
            if len(calls) == 1:  # the publish lands while the request is decoding
                rollout._pending = (zeros, 1)
            return take()

        engine.between_steps = arrives_after_first_token
        groups = rollout.generate([[5, 6, 7]], params)
        assert engine.policy_version == 1 and calls
        for old, new in zip(before[0], groups[0]):
            assert new.policy_version == 0
            assert new.token_ids[0] == old.token_ids[0]  # sampled from the prefill, old weights
            if len(new.token_ids) > 1:
                assert new.token_versions is not None
                assert new.token_versions.tolist() == [0] + [1] * (len(new.token_ids) - 1)
            # All-zero weights give uniform logits: every later token has log-prob -log(V).
            assert all(abs(lp + math.log(engine.vocab_size)) < 1e-5 for lp in new.logprobs[1:])
        assert any(len(c.token_ids) > 1 for c in groups[0])
    finally:
        engine.between_steps = take
        engine.load_weights(original, 0)


def test_a_cancelled_request_ends_and_the_next_one_is_served(engine) -> None:
    polls: list[int] = []

    def gone_after_two_polls() -> bool:
        polls.append(1)
        return len(polls) > 2

    params = SamplingParams(n=2, max_new_tokens=32, seed=3, temperature=1.0)
    with pytest.raises(Cancelled) as err:
        engine.generate([[5, 6, 7]], params, gone_after_two_polls)
    assert err.value.num_steps == 2 and len(polls) == 3
    groups = engine.generate([[5, 6, 7]], SamplingParams(n=2, max_new_tokens=2, seed=3))
    assert len(groups[0]) == 2 and all(c.token_ids.size for c in groups[0])


def test_routed_experts_are_refused_for_a_dense_model(engine) -> None:
    """Routing is asked for MoE router replay; a dense model has none to report (the MoE
    side of this is ``test_vllm_routing.py``)."""
    with pytest.raises(ValueError, match="return_routed_experts"):
        engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2, return_routed_experts=True))
    assert (
        engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))[0][0].routed_experts is None
    )
