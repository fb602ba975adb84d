"""Rollout service configuration (imports without torch or grpc)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.rpc.config import ServerConfig


@dataclass
class RolloutConfig:
    """One rollout replica: engine, device and server."""

    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine; "hf" (transformers + our sampler) works on CPU and GPU."""
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
    """Prompts per streamed Generate response message."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits."""

    def validate(self) -> None:
        if self.replicas < 1:
            raise ValueError("rollout.replicas must be >= 1")
        if self.devices and len(self.devices) != self.replicas:
            raise ValueError("rollout.devices must list one entry per replica")
        if self.prompts_per_message < 1:
            raise ValueError("rollout.prompts_per_message must be >= 1")
