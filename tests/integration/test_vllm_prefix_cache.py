"""vLLM's prefix cache under ``rollout.prefix_caching``: a multi-turn context that extends an
earlier one is served from the cache (the engine counts the tokens it did not compute) and
samples exactly what the uncached engine samples; after a weight update nothing computed
under the old weights is read (requests are salted with the policy version). The same check
run with the salt removed fails, so it can see stale reuse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import vllm  # noqa: F401  (locked: a broken install fails here, never skips)

from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.types import SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=6, n=2, seed=11)
OPENING = [[279, 275, 198, 16, 10, 17], [279, 275, 198, 18, 19, 10, 20, 21]]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_builtin_model("tiny-qwen3", root=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def engines(model_path: Path) -> Iterator[tuple[object, object]]:
    from hybridflow.services.rollout.vllm_engine import VLLMEngine

    cached = VLLMEngine(model_path, max_model_len=256, prefix_caching=True)
    plain = VLLMEngine(model_path, max_model_len=256)
    yield cached, plain
    cached.close()
    plain.close()


def _turns(engine, opening):  # type: ignore[no-untyped-def]
    """Two turns of a conversation: the second context is the first plus its answer and a
    fixed observation (long enough to span whole cache blocks)."""
    first = engine.generate(opening, PARAMS)
    second_contexts = [
        [*p, *g[0].token_ids.tolist(), *([198, 279, 275] * 8)] for p, g in zip(opening, first)
    ]
    return first, engine.generate(second_contexts, PARAMS)


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    for ga, gb in zip(a, b, strict=True):
        for ca, cb in zip(ga, gb, strict=True):
            assert ca.token_ids.tolist() == cb.token_ids.tolist()
            np.testing.assert_allclose(ca.logprobs, cb.logprobs, atol=1e-4)


def _perturbed(model_path: Path) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return list(model.state_dict().items())


def test_cached_turns_sample_what_uncached_ones_do(engines, model_path: Path) -> None:  # type: ignore[no-untyped-def]
    cached, plain = engines
    before = cached.num_cached_prompt_tokens
    _same(_turns(cached, OPENING)[1], _turns(plain, OPENING)[1])
    assert cached.num_cached_prompt_tokens - before > 0  # the second turn hit the cache
    assert plain.num_cached_prompt_tokens == 0

    # New weights: the same contexts again, nothing of the old weights' cache may be read.
    weights = _perturbed(model_path)
    for engine in (cached, plain):
        engine.load_weights(weights, 1)
    _same(_turns(cached, OPENING)[1], _turns(plain, OPENING)[1])


def test_without_the_version_salt_stale_blocks_would_be_read(
    engines, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The check above can fail: with the salt removed, a context cached under one set of
    weights and asked for again under another samples differently from an uncached engine."""
    from vllm.inputs import TokensPrompt

    cached, plain = engines
    monkeypatch.setattr(
        cached, "_prompt", lambda p: TokensPrompt(prompt_token_ids=np.asarray(p).tolist())
    )
    contexts = [[*OPENING[0], *([198, 279, 275] * 12)]]
    cached.generate(contexts, PARAMS)  # cached under the current weights
    weights = _perturbed(model_path)
    weights = [(k, v * 1.5 if v.dim() == 2 else v) for k, v in weights]
    version = cached.policy_version + 1
    for engine in (cached, plain):
        engine.load_weights(weights, version)
    a, b = cached.generate(contexts, PARAMS), plain.generate(contexts, PARAMS)
    diff = max(
        float(np.abs(ca.logprobs[:1] - cb.logprobs[:1]).max())
        for ga, gb in zip(a, b)
        for ca, cb in zip(ga, gb)
    )
    assert diff > 1e-3
