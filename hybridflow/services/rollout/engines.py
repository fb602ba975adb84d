"""The rollout engines by name, and the one place a replica's engine is built.

``ENGINES`` maps ``rollout.engine`` to a builder ``(config, model path, seed) -> Engine``.
Adding an engine (SGLang, say) is one module with a class that keeps the contract of
``engine_contract.py``, one line here, the name in ``RolloutConfig.engine`` (a test keeps the
two in step), and the conformance suite (``tests/integration/test_engine_conformance.py``)
passing with the name added to its list. Builders import their engine only when called, so
this module costs nothing to import.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hybridflow.lora.config import LoraConfig
from hybridflow.services.rollout.config import RolloutConfig
from hybridflow.services.rollout.engine_contract import Engine

EngineBuilder = Callable[[RolloutConfig, Path, int, "LoraConfig | None", str], Engine]
"""(the replica's config, the checkpoint directory, the replica's seed, the learner's LoRA
adapters or None, how the replica applies them: adapter | merged) -> a ready engine."""


def _hf(
    cfg: RolloutConfig, model_path: Path, seed: int, lora: LoraConfig | None, lora_mode: str
) -> Engine:
    from hybridflow.services.rollout.engine import HFEngine

    return HFEngine(
        model_path, device=cfg.device, dtype=cfg.dtype, seed=seed, lora=lora, lora_mode=lora_mode
    )


def _vllm(
    cfg: RolloutConfig, model_path: Path, seed: int, lora: LoraConfig | None, lora_mode: str
) -> Engine:
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
        prefix_caching=cfg.prefix_caching,
        lora=lora,
        lora_mode=lora_mode,
    )


ENGINES: dict[str, EngineBuilder] = {"hf": _hf, "vllm": _vllm}
"""``rollout.engine`` names and their builders."""


def build_engine(
    cfg: RolloutConfig,
    model_path: Path,
    replica_index: int = 0,
    lora: LoraConfig | None = None,
    lora_mode: str = "adapter",
) -> Engine:
    """The engine ``cfg.engine`` names, seeded ``cfg.seed + replica_index``, taking the
    learner's LoRA adapters when ``lora`` is given (ValueError naming what is missing or
    wrong)."""
    builder = ENGINES.get(cfg.engine)
    if builder is None:
        raise ValueError(f"unknown rollout.engine {cfg.engine!r}; known: {sorted(ENGINES)}")
    return builder(cfg, model_path, cfg.seed + replica_index, lora, lora_mode)
