"""Sampling from the tenant model: each sampled token's log-prob is the model's own (what the
RL losses' ratio compares against), a seed repeats a sample, stops end where the SDK says, and
out-of-bounds requests are refused by name; calls batched together (prompts of other lengths,
other parameters) each get what they would get alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.errors import BadRequest
from hybridflow.models import resolve_model_path
from hybridflow.services.tinker.sampler import (
    SampleParams,
    SampleRequest,
    prompt_logprobs,
    sample,
    sample_many,
)

PROMPT = np.array([5, 17, 9, 30, 2], dtype=np.int64)


@pytest.fixture(scope="module")
def path() -> Path:
    return resolve_model_path("builtin:tiny-qwen3")


@pytest.fixture(scope="module")
def model(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _teacher_forced(model: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    ids = torch.tensor([[*PROMPT.tolist(), *tokens]])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    start = len(PROMPT) - 1
    return np.array([float(lp[start + i, t]) for i, t in enumerate(tokens)])


def test_sampled_logprobs_are_the_models_own_and_a_seed_repeats_the_sample(
    model: torch.nn.Module,
) -> None:
    params = SampleParams.from_json({"max_tokens": 6, "seed": 3, "stop": []})
    first = sample(model, PROMPT, 4, params, set(), lambda t: "")
    again = sample(model, PROMPT, 4, params, set(), lambda t: "")
    assert [c.tokens for c in first] == [c.tokens for c in again]
    for completion in first:
        assert len(completion.tokens) == 6 and not completion.stopped  # no stop at all
        np.testing.assert_allclose(
            completion.logprobs, _teacher_forced(model, completion.tokens), atol=1e-4
        )
    other = sample(
        model, PROMPT, 4, SampleParams.from_json({"max_tokens": 6, "seed": 4}), set(), str
    )
    assert [c.tokens for c in other] != [c.tokens for c in first]


def test_greedy_and_top_k_one_agree_and_stops_end_where_asked(
    model: torch.nn.Module, path: Path
) -> None:
    greedy = sample(model, PROMPT, 1, SampleParams(max_tokens=5, temperature=0), set(), str)[0]
    top1 = sample(model, PROMPT, 2, SampleParams(max_tokens=5, top_k=1, seed=9), set(), str)
    assert all(c.tokens == greedy.tokens for c in top1)
    # the first token not seen before it: the stop there ends the completion there
    k = next(i for i in range(1, 5) if greedy.tokens[i] not in greedy.tokens[:i])
    stop_token = greedy.tokens[k]
    by_id = sample(
        model,
        PROMPT,
        1,
        SampleParams(max_tokens=5, temperature=0, stop_ids=(stop_token,)),
        set(),
        str,
    )[0]
    assert by_id.tokens == greedy.tokens[: k + 1] and by_id.stopped  # the stop token is kept
    eos = sample(model, PROMPT, 1, SampleParams(max_tokens=5, temperature=0), {stop_token}, str)[0]
    assert eos.tokens == greedy.tokens[: k + 1] and eos.stopped
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.decode(greedy.tokens[:2])
    by_text = sample(
        model,
        PROMPT,
        1,
        SampleParams(max_tokens=5, temperature=0, stop_strings=(text,)),
        set(),
        tokenizer.decode,
    )[0]
    assert by_text.tokens == greedy.tokens[:2] and by_text.stopped


def test_prompt_logprobs_are_nan_then_each_tokens_own(model: torch.nn.Module) -> None:
    got = prompt_logprobs(model, PROMPT)
    assert np.isnan(got[0]) and len(got) == len(PROMPT)
    with torch.no_grad():
        lp = torch.log_softmax(
            model(input_ids=torch.from_numpy(PROMPT)[None]).logits[0].float(), -1
        )
    expected = [float(lp[i - 1, PROMPT[i]]) for i in range(1, len(PROMPT))]
    np.testing.assert_allclose(got[1:], expected, atol=1e-5)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be in"),
        ({"max_tokens": 5, "top_p": 0}, "top_p in"),
        ({"max_tokens": 5, "stop": ["a", 3]}, "not both"),
        ({"max_tokens": 5, "temperature": -1}, "temperature >= 0"),
    ],
)
def test_bad_sampling_params_are_refused_by_name(raw: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(BadRequest, match=message):
        SampleParams.from_json(raw)


def test_too_many_samples_or_too_long_are_refused(model: torch.nn.Module) -> None:
    with pytest.raises(BadRequest, match="num_samples"):
        sample(model, PROMPT, 65, SampleParams(max_tokens=1), set(), str)
    with pytest.raises(BadRequest, match="over the model's context"):
        sample(model, PROMPT, 1, SampleParams(max_tokens=4096), set(), str)


def test_calls_batched_together_each_get_what_they_get_alone(model: torch.nn.Module) -> None:
    """Three calls in one batch: prompts of 5, 2 and 8 tokens (left-padded), greedy, seeded
    sampling and a stop token, 6, 3 and 6 tokens at most: each call's tokens are those it
    gets alone, its log-probs the model's own within float noise."""
    eos = {0}
    requests = [
        SampleRequest(PROMPT, 2, SampleParams(max_tokens=6, temperature=0, eos=False)),
        SampleRequest(PROMPT[:2], 3, SampleParams(max_tokens=3, seed=11, eos=False)),
        SampleRequest(np.array([9, 8, 7, 6, 5, 4, 3, 2]), 2, SampleParams(max_tokens=6, seed=5)),
    ]
    batched = sample_many(model, requests, eos, str)
    for request, together in zip(requests, batched, strict=True):
        alone = sample(model, request.prompt, request.num_samples, request.params, eos, str)
        assert [c.tokens for c in together] == [c.tokens for c in alone]
        assert [c.stopped for c in together] == [c.stopped for c in alone]
        for a, b in zip(together, alone, strict=True):
            assert len(a.tokens) <= request.params.max_tokens
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert [len(c.tokens) for c in batched[0]] == [6, 6]
    assert [len(c.tokens) for c in batched[1]] == [3, 3, 3]
