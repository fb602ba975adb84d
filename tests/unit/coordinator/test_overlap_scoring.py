"""Scoring beside generation (``coordinator.overlap_scoring``), with fake services whose calls
wait on gates the test opens: a replica generates its next request while the one before is
scored; groups reach the buffer in the order they were generated; a scoring failure re-queues
that request's prompts and those generated meanwhile, and ends the dispatcher with it."""

from __future__ import annotations

import threading

from hybridflow.coordinator.buffer import Admission, GroupBuffer
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.dispatch import ReplicaDispatcher
from hybridflow.coordinator.staleness import StalenessBound
from hybridflow.types import SamplingParams, ScoreItem, ScoreResult

from .fakes import FakeReward, FakeRollout, records

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4, n=2, seed=1)
WAIT_S = 60.0


class GatedReward(FakeReward):
    """Each call announces itself, then waits for its own gate; ``fail_call``: that call
    (0-based) raises once its gate opens."""

    def __init__(self, fail_call: int | None = None) -> None:
        self.entered: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.gates: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.calls = 0
        self.fail_call = fail_call

    def score_batch(self, items: list[ScoreItem]) -> list[ScoreResult]:
        call, self.calls = self.calls, self.calls + 1
        self.entered[call].set()
        assert self.gates[call].wait(WAIT_S)
        if call == self.fail_call:
            raise RuntimeError("the scorer broke")
        return super().score_batch(items)


class CountingRollout(FakeRollout):
    """Announces each Generate call (``started[k]``: the k-th has begun)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.calls = 0

    def generate(self, prompts, params, request_id=""):
        self.started[self.calls].set()
        self.calls += 1
        return super().generate(prompts, params, request_id)


def dispatcher(rollout, reward, num_prompts: int, stop: threading.Event, overlap: bool):
    buffer = GroupBuffer(Admission(batch_groups=num_prompts, bound=StalenessBound(0)))
    d = ReplicaDispatcher(
        0,
        rollout,
        reward,
        lambda ids: "".join(map(str, ids)),
        buffer,
        PromptCursor(records(num_prompts), seed=0),
        PARAMS,
        prompts_per_request=2,
        stop=stop,
        overlap_scoring=overlap,
    )
    d.start()
    return d, buffer


def test_the_next_request_generates_while_the_last_one_is_scored():
    rollout, reward, stop = CountingRollout(), GatedReward(), threading.Event()
    d, buffer = dispatcher(rollout, reward, 6, stop, overlap=True)
    assert reward.entered[0].wait(WAIT_S)  # request 0 is being scored, its gate shut...
    assert rollout.started[1].wait(WAIT_S)  # ...and request 1 generates meanwhile
    assert not reward.entered[1].is_set()  # one request scoring at a time
    for gate in reward.gates:
        gate.set()
    assert reward.entered[2].wait(WAIT_S)  # the third and last request of the step
    stop.set()
    buffer.wake_all()
    d.join(WAIT_S)
    assert not d.is_alive() and d.error is None and d.num_requeued == 0 and d.score_s > 0
    groups, requeued = buffer.drain()
    assert [g.prompt.seq for g in groups] == [0, 1, 2, 3, 4, 5] and requeued == []


def test_without_overlap_the_replica_waits_for_its_scores():
    rollout, reward, stop = CountingRollout(), GatedReward(), threading.Event()
    d, buffer = dispatcher(rollout, reward, 6, stop, overlap=False)
    assert reward.entered[0].wait(WAIT_S)
    assert not rollout.started[1].is_set()  # held by the scoring call on its own thread
    for gate in reward.gates:
        gate.set()
    assert reward.entered[2].wait(WAIT_S)
    stop.set()
    buffer.wake_all()
    d.join(WAIT_S)
    assert not d.is_alive() and d.error is None
    assert [g.prompt.seq for g in buffer.drain()[0]] == [0, 1, 2, 3, 4, 5]


def test_a_scoring_failure_requeues_that_request_and_the_one_generated_meanwhile():
    rollout, reward, stop = CountingRollout(), GatedReward(fail_call=0), threading.Event()
    d, buffer = dispatcher(rollout, reward, 6, stop, overlap=True)
    assert reward.entered[0].wait(WAIT_S) and rollout.started[1].wait(WAIT_S)
    reward.gates[0].set()
    d.join(WAIT_S)
    assert not d.is_alive()
    assert isinstance(d.error, RuntimeError) and "the scorer broke" in str(d.error)
    groups, requeued = buffer.drain()
    assert groups == [] and sorted(p.seq for p in requeued) == [0, 1, 2, 3]
    assert d.num_requeued == 4
