"""On a CUDA machine with the ``vllm`` package: LoRA syncs reach the vllm engine on the GPU from a
learner with LoRA adapters (rank 8) on the GPU, verified. Log-prob parity (<= 1e-4, fp32) after
each of three syncs, at T=1 and T=0.7, for both delivery modes (``weight_sync.lora``: adapter,
merged) over both transports (dist: NCCL; gRPC): the CPU grid of
tests/integration/test_lora_delivery.py at TP 1 on CUDA. Skipped (with the reason) anywhere else.

Written without a GPU at hand: not yet run (scripts/gpu_check.sh runs it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

import torch  # noqa: E402

from tests import skips  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip(skips.no_gpu("needs a CUDA device"), allow_module_level=True)
import vllm  # noqa: E402, F401  (the CUDA build on a GPU machine: a broken install fails)

from hybridflow.services.learner.client import GrpcLearnerClient  # noqa: E402
from hybridflow.weights.config import WeightSyncConfig  # noqa: E402
from tests.helpers import start_learner_server  # noqa: E402
from tests.integration.test_lora_delivery import LORA  # noqa: E402
from tests.integration.test_vllm_rollout import (  # noqa: E402
    PARITY_TOL,
    VLLMService,
    parity,
    train_once,
)

MODES = ("adapter", "merged")


@pytest.fixture(scope="module")
def probe(tiny_model_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    return [tok.encode(t, add_special_tokens=False) for t in ("1+2=", "7+8=", "12+30=")]


@pytest.fixture(scope="module")
def lora_services(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, VLLMService]]:
    """One vLLM replica on the GPU per delivery mode, started on first use; starting one stops
    the other (the cases come grouped by mode: one engine on the GPU at a time)."""
    started: list[VLLMService] = []

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, mode: str) -> VLLMService:
            for old in self.values():
                old.stop()
            self.clear()
            service = VLLMService(
                tiny_model_path,
                tmp_path_factory.mktemp(f"vllm-cuda-lora-{mode}"),
                1,
                "rollout.device=cuda",
                "learner.lora.rank=8",
                f"weight_sync.lora={mode}",
            )
            started.append(service)
            self[mode] = service
            return service

    try:
        yield Lazy()
    finally:
        for service in started:
            service.stop()


@pytest.mark.parametrize(
    ("mode", "transport"), [(m, t) for m in MODES for t in ("dist", "grpc")]
)  # grouped by mode: one replica start per mode
def test_cuda_parity_after_each_of_three_lora_syncs(
    lora_services, tiny_model_path: Path, probe, mode: str, transport: str
) -> None:
    service = lora_services[mode]
    cfg = WeightSyncConfig(transport=transport, backend="auto", timeout_s=120, lora=mode)
    learner_server, core = start_learner_server(
        tiny_model_path,
        weight_sync=cfg,
        optimizer={"lr": 1e-2},
        lora=LORA,
        topology={"device": "cuda"},
    )
    learner = GrpcLearnerClient(learner_server.address)
    rollout = service.client
    try:
        # The replica outlives earlier tests' learners and never takes an older version:
        # this learner continues their numbering and first sends its own fresh adapters.
        base = rollout.status().policy_version
        core.worker.policy_version = base  # type: ignore[attr-defined]
        report = learner.publish_weights([service.address])
        worker = core.worker  # type: ignore[attr-defined]
        adapter_bytes = sum(p.numel() * 4 for p in worker.adapters.parameters())
        assert report.num_bytes == adapter_bytes  # adapters only, TP 1
        assert parity(rollout, learner, probe) <= PARITY_TOL
        for step in range(3):
            assert train_once(rollout, learner, probe, base + step) == base + step + 1
            assert parity(rollout, learner, probe) > 1e-3  # stale until synced
            report = learner.publish_weights([service.address])  # verified, or raises
            print(f"lora {mode} {transport} sync {step + 1}: {report.duration_s:.4f} s")
            assert rollout.status().policy_version == base + step + 1
            assert parity(rollout, learner, probe) <= PARITY_TOL
            assert parity(rollout, learner, probe, temperature=0.7) <= PARITY_TOL
    finally:
        learner_server.stop(0)
