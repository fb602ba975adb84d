"""A rollout replica whose engine died answers a liveness probe UNAVAILABLE, naming why, so the
coordinator's probes (rejoin, publish) never count it alive while its service exits for the
supervisor to restart it (issue 27, row 6; the exit itself: test_vllm_replica_exit.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hybridflow.errors import Unavailable
from hybridflow.services.rollout.local import LocalRollout


def _engine(dead_reason: str | None) -> SimpleNamespace:
    return SimpleNamespace(
        dead_reason=dead_reason,
        policy_version=3,
        eos_token_id=0,
        vocab_size=16,
        tensor_parallel_size=1,
        between_steps=None,
        on_dead=lambda _callback: None,
        close=lambda: None,
    )


def test_a_live_engine_answers_the_probe() -> None:
    status = LocalRollout(_engine(None), "tiny", "vllm").status(timeout_s=5)  # type: ignore[arg-type]
    assert status.policy_version == 3


def test_a_dead_engine_fails_the_probe_naming_why() -> None:
    rollout = LocalRollout(_engine("vLLM worker process VllmWorker-0 died"), "tiny", "vllm")  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="VllmWorker-0 died"):
        rollout.status(timeout_s=5)
