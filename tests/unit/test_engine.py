"""HFEngine with a fake uniform-logits model and with the real built-in tiny model."""

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import LlamaConfig

from hybridflow.models.tokenizer import build_char_tokenizer
from hybridflow.services.rollout.engine import HFEngine
from hybridflow.types import Completion, SamplingParams

VOCAB = 101
EOS = 2


class UniformLM(torch.nn.Module):
    """Fake causal LM: all-zero logits, records the inputs of every forward call."""

    def __init__(self) -> None:
        super().__init__()
        self.config = LlamaConfig(vocab_size=VOCAB, hidden_size=8, num_attention_heads=2)
        self.embed = torch.nn.Embedding(VOCAB, 4)
        self.calls: list[dict[str, torch.Tensor]] = []

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(
            {
                "input_ids": input_ids.clone(),
                "position_ids": kwargs["position_ids"].clone(),
                "attention_mask": kwargs["attention_mask"].clone(),
            }
        )
        num_logits = 1 if kwargs.get("logits_to_keep") == 1 else input_ids.shape[1]
        logits = torch.zeros(input_ids.shape[0], num_logits, VOCAB)
        return SimpleNamespace(logits=logits, past_key_values=kwargs["past_key_values"])


def fake_engine(seed: int = 0) -> tuple[HFEngine, UniformLM]:
    model = UniformLM()
    return HFEngine.from_loaded(model, build_char_tokenizer(), seed=seed), model


def check_well_formed(c: Completion, max_new_tokens: int, stops: set[int]) -> None:
    assert len(c.token_ids) == len(c.logprobs) >= 1
    assert not stops & set(c.token_ids[:-1])  # nothing is generated after a stop token
    if c.finish_reason == "stop":
        assert c.token_ids[-1] in stops
    else:
        assert c.finish_reason == "length"
        assert len(c.token_ids) == max_new_tokens and c.token_ids[-1] not in stops


# ---------------------------------------------------------------- fake model


def test_uniform_logits_give_minus_log_vocab_and_respect_limits() -> None:
    engine, _ = fake_engine()
    params = SamplingParams(temperature=1.0, max_new_tokens=5, n=16, seed=3)
    groups = engine.generate([[10, 11], [12, 13, 14], [15]], params)
    assert [len(g) for g in groups] == [16, 16, 16]
    reasons = set()
    for group in groups:
        for c in group:
            check_well_formed(c, 5, {EOS})
            assert c.policy_version == 0
            assert c.logprobs == pytest.approx([-math.log(VOCAB)] * len(c.logprobs), abs=1e-6)
            reasons.add(c.finish_reason)
    # 48 rows x 5 draws at 1/101 per draw: seed 3 gives both outcomes.
    assert reasons == {"stop", "length"}


def test_temperature_does_not_change_uniform_logprob() -> None:
    engine, _ = fake_engine()
    for temperature in (0.0, 0.3, 2.0):
        params = SamplingParams(temperature=temperature, max_new_tokens=2, seed=0)
        (group,) = engine.generate([[20]], params)
        assert group[0].logprobs == pytest.approx([-math.log(VOCAB)] * 2, abs=1e-6)


def test_stop_token_ids_end_completions() -> None:
    engine, _ = fake_engine()
    stops = set(range(4, VOCAB))  # everything but the specials stops
    params = SamplingParams(max_new_tokens=6, n=8, seed=1, stop_token_ids=tuple(sorted(stops)))
    for c in engine.generate([[30, 31]], params)[0]:
        check_well_formed(c, 6, stops | {EOS})
        assert c.finish_reason == "stop"


def test_left_padding_positions_and_masks() -> None:
    engine, model = fake_engine()
    params = SamplingParams(temperature=0.0, max_new_tokens=3)  # greedy on zeros: token 0
    engine.generate([[40, 41], [42, 43, 44, 45]], params)
    prefill, step1, step2 = model.calls
    assert prefill["input_ids"].tolist() == [[0, 0, 40, 41], [42, 43, 44, 45]]
    assert prefill["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert prefill["position_ids"].tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert step1["position_ids"].tolist() == [[2], [4]]
    assert step2["position_ids"].tolist() == [[3], [5]]
    assert step2["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]


def test_validation_names_the_problem() -> None:
    engine, _ = fake_engine()
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[5]], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="sampling.top_k"):
        engine.generate([[5]], SamplingParams(top_k=-1))
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[5]], SamplingParams(max_new_tokens=0))
    with pytest.raises(ValueError, match=r"prompts\[1\] has token id 101"):
        engine.generate([[5], [6, 101]], SamplingParams())
    with pytest.raises(ValueError, match=r"prompts\[0\] is empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="stop_token_ids"):
        engine.generate([[5]], SamplingParams(stop_token_ids=(-1,)))
    assert engine.generate([], SamplingParams()) == []


# ---------------------------------------------------------------- real tiny model


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_path: Path) -> HFEngine:
    return HFEngine(tiny_model_path, seed=0)


def encode(engine: HFEngine, texts: list[str]) -> list[list[int]]:
    return [engine.tokenizer.encode(t) for t in texts]


def test_batched_greedy_equals_one_prompt_at_a_time(tiny_engine: HFEngine) -> None:
    prompts = encode(tiny_engine, ["3+4=", "12+7=", "0+0=", "19+19="])
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    batched = tiny_engine.generate(prompts, params)
    for prompt, group in zip(prompts, batched, strict=True):
        (alone,) = tiny_engine.generate([prompt], params)
        assert group[0].token_ids.tolist() == alone[0].token_ids.tolist()
        assert group[0].finish_reason == alone[0].finish_reason
        assert group[0].logprobs == pytest.approx(alone[0].logprobs, abs=1e-5)


def full_forward_logprobs(
    model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], temperature: float
) -> list[list[float]]:
    """No cache, right padding, default positions: how the learner recomputes log-probs."""
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    out = []
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        pos = torch.arange(len(p) - 1, len(p) + len(r) - 1)
        out.append(logprobs[i, pos, torch.tensor(list(r))].tolist())
    return out


@pytest.mark.parametrize(("top_p", "top_k"), [(0.95, 0), (0.95, 5), (1.0, 3)])
def test_logprobs_before_top_k_and_top_p_match_a_full_forward(
    tiny_engine: HFEngine, top_p: float, top_k: int
) -> None:
    # (At top_p = 1, top_k = 0 every engine's log-probs are checked in
    # test_engine_conformance.py.) Truncation changes what is drawn, not the reported log-prob.
    prompts = encode(tiny_engine, ["3+4=", "12+7=", "5+5=", "hello "])
    params = SamplingParams(
        temperature=0.7, top_p=top_p, top_k=top_k, max_new_tokens=5, n=3, seed=11
    )
    groups = tiny_engine.generate(prompts, params)
    flat_prompts = [p for p, g in zip(prompts, groups, strict=True) for _ in g]
    flat = [c for g in groups for c in g]
    expected = full_forward_logprobs(
        tiny_engine.model, flat_prompts, [c.token_ids for c in flat], 0.7
    )
    for c, ref in zip(flat, expected, strict=True):
        assert c.logprobs == pytest.approx(ref, abs=1e-5)


def test_seeded_generation_is_reproducible(tiny_engine: HFEngine) -> None:
    prompts = encode(tiny_engine, ["3+4=", "8+9="])
    params = SamplingParams(temperature=1.0, max_new_tokens=4, n=8, seed=5)
    first = tiny_engine.generate(prompts, params)
    second = tiny_engine.generate(prompts, params)
    assert first == second
    other = tiny_engine.generate(
        prompts, SamplingParams(temperature=1.0, max_new_tokens=4, n=8, seed=6)
    )
    assert [c.token_ids.tolist() for g in other for c in g] != [
        c.token_ids.tolist() for g in first for c in g
    ]


def test_load_weights_rejects_bad_tensors_and_changes_nothing(tiny_model_path: Path) -> None:
    engine = HFEngine(tiny_model_path)
    prompts = encode(engine, ["3+4="])
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    before = engine.generate(prompts, params)[0][0]
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}

    with pytest.raises(ValueError, match="model.norm.weight.*shape"):
        engine.load_weights(
            [
                (
                    "model.layers.0.mlp.up_proj.weight",
                    torch.zeros_like(state["model.layers.0.mlp.up_proj.weight"]),
                ),
                ("model.norm.weight", torch.zeros(3)),
            ],
            policy_version=9,
        )
    with pytest.raises(ValueError, match="'not.a.weight'"):
        engine.load_weights([("not.a.weight", torch.zeros(1))], policy_version=9)
    # a rejected update leaves every tensor and the version untouched
    assert engine.policy_version == 0
    for name, value in engine.model.state_dict().items():
        assert torch.equal(value, state[name]), name

    # (That accepted weights take effect is checked for every engine in
    # test_engine_conformance.py.)
    assert engine.generate(prompts, params)[0][0] == before


def test_generation_holds_the_weights_lock() -> None:
    """Every forward runs under the lock that load_weights takes, so swaps fall between requests."""
    engine, model = fake_engine()
    held: list[bool] = []
    original = model.forward

    def forward(input_ids: torch.Tensor, **kwargs: Any) -> SimpleNamespace:
        held.append(engine._lock.locked())
        return original(input_ids, **kwargs)

    model.forward = forward  # type: ignore[method-assign]
    engine.generate([[5, 6]], SamplingParams(temperature=0.0, max_new_tokens=3))
    assert held == [True, True, True]
    assert not engine._lock.locked()
