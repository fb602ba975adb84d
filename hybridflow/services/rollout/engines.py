"""Chooses and builds the rollout engine a replica's config asks for."""

from __future__ import annotations

from pathlib import Path

from hybridflow.services.rollout.config import RolloutConfig
from hybridflow.services.rollout.local import Engine


def build_engine(cfg: RolloutConfig, model_path: Path, replica_index: int = 0) -> Engine:
    """The engine of ``cfg.engine`` (ValueError naming what is missing or wrong)."""
    seed = cfg.seed + replica_index
    if cfg.engine == "vllm":
        from hybridflow.services.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path,
            device=cfg.device,
            dtype=cfg.dtype,
            seed=seed,
            tensor_parallel_size=cfg.tensor_parallel_size,
            max_model_len=cfg.max_model_len,
            kv_cache_gib=cfg.kv_cache_gib,
            num_threads=cfg.num_threads,
        )
    from hybridflow.services.rollout.engine import HFEngine

    return HFEngine(model_path, device=cfg.device, dtype=cfg.dtype, seed=seed)
