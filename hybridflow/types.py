"""Domain types shared by every service: plain dataclasses, no torch, no grpc.

Token sequences are lists of ints here; the wire codec (``hybridflow.rpc.codec``) packs them
into one int32 buffer plus offsets. Nothing in this module knows about processes or sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How a rollout engine samples completions for one request."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    max_new_tokens: int = 16
    """Upper bound on generated tokens per completion."""
    n: int = 1
    """Completions per prompt (the GRPO group size)."""
    seed: int | None = None
    """Seed for this request's sampler; None draws from the engine's generator."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end a completion (EOS always does)."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if not self.temperature >= 0.0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")


@dataclass
class Completion:
    """One sampled continuation of a prompt, token-in/token-out."""

    token_ids: list[int]
    """Generated token ids (EOS included when the completion stopped on it)."""
    logprobs: list[float]
    """Log-prob of each sampled token under the sampling distribution (temperature applied)."""
    finish_reason: FinishReason
    """"stop" (EOS or a stop token) or "length" (hit max_new_tokens)."""
    policy_version: int
    """Version of the weights that generated its first token (the oldest it depends on)."""
    token_versions: list[int] | None = None
    """Per-token weight versions when weights changed mid-sequence; None when all are
    ``policy_version``."""


@dataclass
class ScoreItem:
    """One response to score; the reward service picks a scorer by ``data_source``."""

    data_source: str
    response: str
    ground_truth: str | None
    prompt: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScoreResult:
    """A score, or an error message (then score is 0 and the sample counts as failed)."""

    score: float
    error: str | None = None


@dataclass
class TrainSample:
    """One scored completion as the learner sees it."""

    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    """Per response token, from the rollout engine (for off-policy correction and metrics)."""
    reward: float
    group_id: int
    """Samples of the same prompt share a group id (GRPO normalises within it)."""
    policy_version: int


@dataclass
class TrainStepResult:
    """What one learner optimizer step reports."""

    policy_version: int
    """Learner version after the step (rises by one per optimizer step)."""
    metrics: dict[str, float]
    """verl-style names: actor/pg_loss, actor/entropy, actor/ppo_kl, critic/vf_loss, ..."""


@dataclass
class RolloutStatus:
    """What a rollout replica serves and has done."""

    model: str
    engine: str
    policy_version: int
    eos_token_id: int
    vocab_size: int
    num_requests: int = 0
    num_generated_tokens: int = 0
    tensor_parallel_size: int = 1


@dataclass
class WeightUpdateReport:
    """Result of sending or applying one set of weights."""

    policy_version: int
    num_bytes: int
    duration_s: float
