"""The vLLM engine reports, per completion, the experts a Qwen3-MoE model routed each token
it read to (prompt, then every sampled token but the last): several prompts and completions
in one continuous batch, before and after a weight load, at TP 1 and TP 2. In fp32 vLLM and
transformers route alike on this fixture, so the record must equal transformers' own routing
of the same tokens, position by position."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import vllm  # noqa: F401  (locked: a broken install fails here, never skips)

from hybridflow.types import SamplingParams
from tests.family_checkpoints import build_family_checkpoint
from tests.unit.learner.test_router_replay import _own_routing

PROMPTS = [[5, 9, 30, 31], [60, 17], [40, 41, 42, 43, 44, 45, 46]]


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return build_family_checkpoint(tmp_path_factory.mktemp("moe"), "qwen3_moe", False)


@pytest.fixture(
    scope="module", params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["tp1", "tp2"]
)
def engine(request: pytest.FixtureRequest, moe_path: Path) -> Iterator[object]:
    from hybridflow.services.rollout.vllm_engine import VLLMEngine

    eng = VLLMEngine(moe_path, tensor_parallel_size=request.param, max_model_len=64)
    yield eng
    eng.close()


def own_routing(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """[tokens, MoE layers, top_k] of transformers' own choice, each row's experts sorted."""
    return _own_routing(model, torch.tensor([ids])).sort(-1).values.numpy()


def check_against(model: torch.nn.Module, groups) -> int:  # type: ignore[no-untyped-def]
    """Every completion's record equals ``model``'s routing; the number of rows compared."""
    compared = 0
    for prompt, group in zip(PROMPTS, groups):
        for c in group:
            routed = c.routed_experts
            read = prompt + c.token_ids.tolist()[:-1]
            assert routed is not None and routed.dtype == np.int16
            assert routed.shape == (len(read), 2, 2)
            np.testing.assert_array_equal(np.sort(routed, -1), own_routing(model, read))
            compared += len(read)
    return compared


def test_every_completion_carries_the_routing_of_every_token_it_read(engine, moe_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32).eval()
    params = SamplingParams(n=2, max_new_tokens=8, seed=1, return_routed_experts=True)
    groups = engine.generate(PROMPTS, params)
    assert check_against(model, groups) > 40
    plain = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))
    assert plain[0][0].routed_experts is None

    # New weights (vLLM rebuilds the layers it reloads): the record follows them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(torch.randn_like(p))
    engine.load_weights(list(model.state_dict().items()), 1)
    again = engine.generate(PROMPTS, params)
    assert check_against(model, again) > 40
    assert any(
        not np.array_equal(a.routed_experts, b.routed_experts)
        for ga, gb in zip(groups, again)
        for a, b in zip(ga, gb)
        if a.routed_experts.shape == b.routed_experts.shape
    ), "the perturbed routers should route some token elsewhere"
