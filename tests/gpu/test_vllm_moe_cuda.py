"""On a CUDA machine with the ``vllm`` package: the Qwen3-MoE fixture through vLLM's CUDA
fused-MoE kernels (Triton), which the CPU suite cannot reach (vLLM CPU runs its own
``cpu_fused_moe``). Log-prob parity with transformers (fp32) before and after an in-place
reload of new weights, and the recorded routing equal to transformers' on all but a sliver of
token-layers (GPU top-k can flip near-ties). Skipped (with the reason) anywhere else.

Written without a GPU at hand: not yet run (see docs/model-families.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import torch  # noqa: E402

from tests import skips  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip(skips.no_gpu("needs a CUDA device"), allow_module_level=True)
import vllm  # noqa: E402, F401  (the CUDA build on a GPU machine: a broken install fails)

from hybridflow.types import SamplingParams  # noqa: E402
from tests.family_checkpoints import build_family_checkpoint  # noqa: E402
from tests.integration.test_vllm_routing import PROMPTS, own_routing  # noqa: E402

PARITY_TOL = 1e-4


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return build_family_checkpoint(tmp_path_factory.mktemp("moe-cuda"), "qwen3_moe", False)


@pytest.fixture(scope="module")
def engine(moe_path: Path) -> Iterator[object]:
    from hybridflow.services.rollout.vllm_engine import VLLMEngine

    eng = VLLMEngine(moe_path, device="cuda", max_model_len=64)
    yield eng
    eng.close()


def _max_logprob_gap(model: torch.nn.Module, groups) -> float:  # type: ignore[no-untyped-def]
    gap = 0.0
    for prompt, group in zip(PROMPTS, groups):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids.tolist()], device="cuda")
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float()
            logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
            ours = logp.gather(-1, ids[0, len(prompt) :, None])[:, 0].cpu().numpy()
            gap = max(gap, float(np.abs(ours - c.logprobs).max()))
    return gap


def test_cuda_fused_moe_parity_and_routing_before_and_after_a_reload(engine, moe_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32).cuda().eval()
    params = SamplingParams(n=2, max_new_tokens=8, seed=1, return_routed_experts=True)
    for version in (0, 1):
        if version:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.02)
            engine.load_weights([(n, t.cpu()) for n, t in model.state_dict().items()], version)
        groups = engine.generate(PROMPTS, params)
        assert _max_logprob_gap(model, groups) <= PARITY_TOL
        differing = total = 0
        for prompt, group in zip(PROMPTS, groups):
            for c in group:
                read = prompt + c.token_ids.tolist()[:-1]
                mine = own_routing(model.cpu(), read)
                model.cuda()
                differing += int((np.sort(c.routed_experts, -1) != mine).any(-1).sum())
                total += mine.shape[0] * mine.shape[1]
        assert differing <= max(1, total // 100), (differing, total)
