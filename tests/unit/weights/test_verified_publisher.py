"""``VerifiedPublisher``: the learner's probe log-probs are taken before the weights leave
(so a train step beside a background send cannot change them), every target is probed once
the sync is reported, and a target serving another version or other log-probs fails the
publish with ``DeliveryFailed`` naming it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from hybridflow.errors import DeliveryFailed
from hybridflow.types import WeightUpdateReport
from hybridflow.weights.verify import PROBE_TOKENS, Probe, VerifiedPublisher


class World:
    """A learner whose log-probs are ``learner`` and replicas that serve what was sent,
    unless told to drop a target's updates."""

    def __init__(self) -> None:
        self.learner = np.zeros(PROBE_TOKENS - PROBE_TOKENS // 4)
        self.served: dict[str, tuple[np.ndarray, int]] = {}
        self.dropped: set[str] = set()
        self.log: list[str] = []

    def expected(self, prompt: Sequence[int], response: Sequence[int]) -> np.ndarray:
        self.log.append("expected")
        return self.learner.copy()

    def probe(self, target: str, prompt: Sequence[int], response: Sequence[int]):
        self.log.append(f"probe {target}")
        return self.served.get(target, (np.full_like(self.learner, -9.0), 0))


class Inner:
    def __init__(self, world: World) -> None:
        self.world = world
        self.pending: tuple[Sequence[str], int, np.ndarray] | None = None

    def _deliver(self, targets: Sequence[str], version: int, values: np.ndarray) -> None:
        for t in targets:
            if t not in self.world.dropped:
                self.world.served[t] = (values.copy(), version)

    def publish(self, targets: Sequence[str], version: int) -> WeightUpdateReport:
        self._deliver(targets, version, self.world.learner)
        return WeightUpdateReport(version, 1, 0.0)

    def start(self, targets: Sequence[str], version: int) -> None:
        self.pending = (targets, version, self.world.learner.copy())  # the snapshot

    def finish(self) -> WeightUpdateReport:
        assert self.pending is not None
        targets, version, values = self.pending
        self._deliver(targets, version, values)
        return WeightUpdateReport(version, 1, 0.0)

    def close(self) -> None:
        pass


def publisher(world: World, tolerance: float = 1e-4) -> VerifiedPublisher:
    return VerifiedPublisher(
        Inner(world), Probe.for_vocab(100), world.expected, world.probe, tolerance
    )


def test_a_delivered_sync_passes_and_every_target_is_probed() -> None:
    world = World()
    pub = publisher(world)
    world.learner += 0.5
    assert pub.publish(["a:1", "b:2"], 1).policy_version == 1
    assert world.log == ["expected", "probe a:1", "probe b:2"]


def test_an_undelivered_sync_fails_naming_the_replica() -> None:
    world = World()
    pub = publisher(world)
    pub.publish(["a:1", "b:2"], 1)
    world.dropped.add("b:2")
    world.learner += 0.01
    with pytest.raises(DeliveryFailed, match="v2 did not take effect on replica b:2: it serves v1"):
        pub.publish(["a:1", "b:2"], 2)


def test_a_replica_with_the_version_but_other_weights_fails() -> None:
    world = World()
    pub = publisher(world)
    pub.publish(["a:1"], 1)
    world.served["a:1"] = (world.learner + 3e-4, 1)  # the version moved, the weights did not
    with pytest.raises(DeliveryFailed, match="differ from the learner's by 0.0003"):
        pub.verify(["a:1"], 1, world.learner)
    pub.verify(["a:1"], 1, world.learner + 2.5e-4)  # within the tolerance of what it serves


def test_a_background_publish_is_checked_against_the_weights_it_snapshotted() -> None:
    world = World()
    pub = publisher(world)
    world.learner += 0.5
    pub.start(["a:1"], 1)
    world.learner += 0.5  # the next train step runs beside the send
    assert pub.finish().policy_version == 1  # compared with the log-probs taken at start
    assert world.log == ["expected", "probe a:1"]


def test_the_probe_is_fixed_and_in_the_vocabulary() -> None:
    probe = Probe.for_vocab(50)
    assert probe == Probe.for_vocab(50)
    ids = probe.prompt_ids + probe.response_ids
    assert len(ids) == PROBE_TOKENS and all(4 <= i < 50 for i in ids)
