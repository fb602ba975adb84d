"""On a CUDA machine with the ``vllm`` package: the vllm engine on the GPU, fed by a learner on
the GPU over an NCCL weight-sync group. Log-prob parity (≤ 1e-4, fp32) before and after three
syncs, for both transports. Skipped (with the reason) anywhere else."""

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
from tests.integration.test_vllm_rollout import (  # noqa: E402
    PARITY_TOL,
    PROBE_TEXTS,
    VLLMService,
    parity,
    train_once,
)


@pytest.fixture(scope="module")
def service(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMService]:
    svc = VLLMService(
        tiny_model_path, tmp_path_factory.mktemp("vllm-cuda"), 1, "rollout.device=cuda"
    )
    yield svc
    svc.stop()


@pytest.mark.parametrize("transport", ["dist", "grpc"])
def test_cuda_parity_before_and_after_three_syncs(
    service: VLLMService, tiny_model_path: Path, transport: str
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    probe = [tok.encode(t, add_special_tokens=False) for t in PROBE_TEXTS]
    cfg = WeightSyncConfig(transport=transport, backend="auto", timeout_s=120)
    learner_server, _ = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 2e-3}, topology={"device": "cuda"}
    )
    learner = GrpcLearnerClient(learner_server.address)
    try:
        if service.client.status().policy_version != 0:
            learner.publish_weights([service.address])
        assert parity(service.client, learner, probe) <= PARITY_TOL
        for step in range(3):
            assert train_once(service.client, learner, probe, step) == step + 1
            report = learner.publish_weights([service.address])
            print(f"{transport} sync {step + 1}: {report.duration_s:.4f} s, {report.num_bytes} B")
            assert parity(service.client, learner, probe) <= PARITY_TOL
    finally:
        learner_server.stop(0)
