"""Instant in-process services for the simulated-scale measurement of the coordinator.

The thing measured is the coordinator's own cost (dispatcher threads, admission, buffer,
dataflow, metrics and event logs) as the number of rollout replicas grows, so every service
answers at once with fixed data: no model, no sockets, no RL math. These fakes are benchmark
instruments, not test doubles; the real services are measured by the suites' variants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridflow.types import (
    Completion,
    RolloutStatus,
    SamplingParams,
    ScoreItem,
    ScoreResult,
    TrainSample,
    TrainStepResult,
    WeightUpdateReport,
)


@dataclass
class FakePrompt:
    """A dataset row as the coordinator's dataflow sees it (``dataflow.Prompt``)."""

    prompt_text: str
    prompt_ids: list[int]
    data_source: str = "arith"
    ground_truth: str | None = "1"
    extra_info: dict[str, Any] = field(default_factory=dict)
    index: int = 0


def fake_prompts(num: int, prompt_tokens: int) -> list[FakePrompt]:
    """``num`` rows of ``prompt_tokens`` token ids each."""
    if num < 1 or prompt_tokens < 1:
        raise ValueError(
            f"fake_prompts: num and prompt_tokens must be >= 1, got {num}, {prompt_tokens}"
        )
    return [
        FakePrompt(f"p{i}", [(i + k) % 90 + 3 for k in range(prompt_tokens)], index=i)
        for i in range(num)
    ]


class InstantRollout:
    """Answers every prompt with ``n`` completions of ``response_tokens`` tokens at once."""

    def __init__(self, response_tokens: int) -> None:
        if response_tokens < 1:
            raise ValueError(f"response_tokens must be >= 1, got {response_tokens}")
        self.version = 0
        self._tokens = list(range(5, 5 + response_tokens))
        self._logprobs = [-0.5] * response_tokens
        self.num_requests = 0

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, request_id: str = ""
    ) -> list[list[Completion]]:
        self.num_requests += 1
        version = self.version
        return [
            [
                Completion(list(self._tokens), list(self._logprobs), "length", version)
                for _ in range(params.n)
            ]
            for _ in prompts
        ]

    def status(self, timeout_s: float | None = None) -> RolloutStatus:
        return RolloutStatus("instant", "instant", self.version, 0, 0)


class InstantReward:
    """Scores every item 1.0."""

    def score_batch(self, items: list[ScoreItem]) -> list[ScoreResult]:
        return [ScoreResult(1.0) for _ in items]


class InstantLearner:
    """Counts samples, bumps its version, and 'publishes' by setting the replicas' version."""

    def __init__(self, rollouts: Sequence[InstantRollout]) -> None:
        self.version = 0
        self.num_samples = 0
        self._rollouts = list(rollouts)

    def train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        self.num_samples += len(samples)
        self.version += 1
        return TrainStepResult(self.version, {"actor/pg_loss": 0.0})

    def compute_logprobs(
        self, prompts: list[list[int]], responses: list[list[int]], temperature: float
    ) -> list[list[float]]:
        return [[-0.5] * len(r) for r in responses]

    def publish_weights(self, targets: Sequence[str], catch_up: bool = False) -> WeightUpdateReport:
        for r in self._rollouts:
            r.version = self.version
        return WeightUpdateReport(self.version, 0, 0.0)

    def save_checkpoint(self, path: str) -> str:
        return path


def decode(ids: list[int]) -> str:
    """The fake tokenizer: one character per id."""
    return "".join(chr(48 + i % 10) for i in ids)
