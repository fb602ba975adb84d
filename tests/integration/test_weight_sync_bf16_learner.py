"""A learner computing in bf16 (``learner.memory.dtype: bfloat16``) still publishes its fp32
master weights, in the replica's dtype: an fp32 replica gets them exactly, a bf16 one gets
them rounded to bf16 (half the bytes)."""

import torch

from hybridflow.services.learner.client import GrpcLearnerClient
from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from hybridflow.services.rollout.client import GrpcRolloutClient
from hybridflow.weights.config import WeightSyncConfig
from tests.helpers import start_learner_server, start_rollout_server
from tests.integration.test_weight_sync_dist import train_once


def test_a_bf16_compute_learner_publishes_fp32_master_weights(tiny_model_path):
    cfg = WeightSyncConfig(transport="dist", timeout_s=30)
    learner_server, core = start_learner_server(
        tiny_model_path,
        weight_sync=cfg,
        optimizer={"lr": 1e-3},
        memory=LearnerMemoryConfig(dtype="bfloat16"),
    )
    fp32, fp32_rollout = start_rollout_server(tiny_model_path)
    bf16, bf16_rollout = start_rollout_server(tiny_model_path, dtype="bfloat16")
    learner = GrpcLearnerClient(learner_server.address)
    try:
        train_once(GrpcRolloutClient(fp32.address), learner, 0)
        weights = dict(core.full_weights())
        assert {t.dtype for t in weights.values()} == {torch.float32}
        fp32_bytes = sum(t.numel() * 4 for n, t in weights.items() if n != "lm_head.weight")
        report = learner.publish_weights([fp32.address])
        assert report.num_bytes >= fp32_bytes
        held = fp32_rollout.engine.model.state_dict()
        for name, tensor in weights.items():
            assert held[name].dtype == torch.float32
            assert torch.equal(held[name], tensor), name  # not rounded through bf16
        assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in weights.values())
        report = learner.publish_weights([bf16.address])
        assert report.num_bytes <= fp32_bytes // 2 + 4096
        held = bf16_rollout.engine.model.state_dict()
        for name, tensor in weights.items():
            assert torch.equal(held[name], tensor.to(torch.bfloat16)), name
    finally:
        for s in (learner_server, fp32, bf16):
            s.stop(0)
