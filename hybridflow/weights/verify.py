"""Verified delivery: after a sync, each replica's log-probs on a probe must be the learner's.

A sync can report success and still not change what a replica serves (an adapter id reused,
a load skipped, weights staged and never applied): the run would then train on samples of
old weights and look merely stale. ``VerifiedPublisher`` wraps any publisher: before the
weights leave (every learner rank, while they are still the published ones) the learner
computes the log-probs of a fixed probe sequence; once the sync is reported (rank 0) it asks
every target for its log-probs of the same sequence and the version that computed them
(``ProbeLogprobs``), and raises ``DeliveryFailed`` naming the replica when the version is
not the published one or any log-prob differs by more than ``tolerance``.

Always on for LoRA syncs (``weight_sync.verify``, forced there). The probe costs one
forward of ``PROBE_TOKENS`` tokens on each side per sync; a replica answers after the request
it is running ends (the update applies between requests). Limit: an update whose effect on
the probe is below ``tolerance`` passes even if undelivered; the version check still holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hybridflow.errors import DeliveryFailed
from hybridflow.types import WeightUpdateReport
from hybridflow.weights.base import WeightPublisher

PROBE_TOKENS = 32
"""Length of the probe (prompt + response)."""

ExpectedFn = Callable[[Sequence[int], Sequence[int]], np.ndarray]
"""(prompt, response) -> the learner's log-probs of the response (collective on its ranks)."""
ProbeFn = Callable[[str, Sequence[int], Sequence[int]], tuple[np.ndarray, int]]
"""(target, prompt, response) -> that replica's log-probs and the version it served them at."""


@dataclass(frozen=True)
class Probe:
    """A fixed token sequence: a short context, then the tokens whose log-probs are compared."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]

    @classmethod
    def for_vocab(cls, vocab_size: int, seed: int = 0) -> Probe:
        """Pseudo-random ids (the same on every rank and run), avoiding the lowest ids that
        small vocabularies give to special tokens."""
        low = min(4, vocab_size - 1)
        ids = np.random.default_rng(seed).integers(low, vocab_size, size=PROBE_TOKENS)
        split = PROBE_TOKENS // 4
        return cls(tuple(int(i) for i in ids[:split]), tuple(int(i) for i in ids[split:]))


class VerifiedPublisher:
    """A ``WeightPublisher`` whose every sync is checked on every target (module doc)."""

    def __init__(
        self,
        inner: WeightPublisher,
        probe: Probe,
        expected: ExpectedFn,
        probe_replica: ProbeFn | None,
        tolerance: float,
        rank: int = 0,
    ) -> None:
        """``probe_replica`` is used on rank 0 only (other ranks may pass None)."""
        self._inner = inner
        self._probe = probe
        self._expected = expected
        self._probe_replica = probe_replica
        self._tolerance = tolerance
        self._rank = rank
        self._pending: tuple[tuple[str, ...], int, np.ndarray] | None = None

    def publish(self, targets: Sequence[str], version: int) -> WeightUpdateReport:
        expected = self._learner_logprobs()
        report = self._inner.publish(targets, version)
        self.verify(targets, version, expected)
        return report

    def start(self, targets: Sequence[str], version: int) -> None:
        expected = self._learner_logprobs()  # before the next train step changes the weights
        self._inner.start(targets, version)
        self._pending = (tuple(targets), version, expected)

    def finish(self) -> WeightUpdateReport:
        report = self._inner.finish()
        if self._pending is not None:
            targets, version, expected = self._pending
            self._pending = None
            self.verify(targets, version, expected)
        return report

    def retire(self, keep: Sequence[str]) -> None:
        self._inner.retire(keep)

    def close(self) -> None:
        self._inner.close()

    def _learner_logprobs(self) -> np.ndarray:
        probe = self._probe
        return np.asarray(self._expected(probe.prompt_ids, probe.response_ids), dtype=np.float64)

    def verify(self, targets: Sequence[str], version: int, expected: np.ndarray) -> None:
        """Rank 0: DeliveryFailed naming the first target that does not serve ``version``
        with the learner's log-probs (within the tolerance)."""
        if self._rank != 0:
            return
        if self._probe_replica is None:
            raise ValueError("weight_sync.verify: no way to reach the replicas' probes")
        probe = self._probe
        for target in targets:
            got, served = self._probe_replica(target, probe.prompt_ids, probe.response_ids)
            got = np.asarray(got, dtype=np.float64)
            if served != version:
                raise DeliveryFailed(
                    f"weights v{version} did not take effect on replica {target}: it serves "
                    f"v{served} after the sync reported success"
                )
            if got.shape != expected.shape:
                raise DeliveryFailed(
                    f"replica {target} answered the probe with {got.size} log-probs, "
                    f"expected {expected.size}"
                )
            diff = float(np.max(np.abs(got - expected)))
            if not diff <= self._tolerance:
                raise DeliveryFailed(
                    f"weights v{version} did not take effect on replica {target}: its "
                    f"log-probs on the probe differ from the learner's by {diff:.3g} "
                    f"(weight_sync.verify_tolerance {self._tolerance:g})"
                )
