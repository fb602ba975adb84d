"""Fixtures of the learner unit tests: a random tiny Llama checkpoint in a temp directory."""

from pathlib import Path

import pytest

from hybridflow.types import TrainSample
from tests.helpers import build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"))


def _make_samples(rewards: list[float], group_size: int = 2) -> list[TrainSample]:
    """Samples with varied prompt/response lengths; ids are printable characters (>= 4)."""
    samples = []
    for i, reward in enumerate(rewards):
        prompt = [10 + (3 * i + k) % 50 for k in range(3 + i % 3)]
        response = [20 + (5 * i + k) % 40 for k in range(2 + (i * 2) % 5)]
        samples.append(
            TrainSample(
                prompt_ids=prompt,
                response_ids=response,
                rollout_logprobs=[-1.0] * len(response),
                reward=reward,
                group_id=i // group_size,
                policy_version=0,
            )
        )
    return samples


@pytest.fixture
def make_samples():  # type: ignore[no-untyped-def]
    """Builder of train samples: ``make_samples(rewards, group_size=2)``."""
    return _make_samples
