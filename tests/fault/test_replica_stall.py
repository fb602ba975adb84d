"""A hung replica is a failed replica (issue 27, rows 6, 8 and 11), with fake services and a
fake clock: a replica that stops answering leaves the dispatch set once it has been silent
``replica_stall_timeout_s`` (measured on the fake clock, so no test waits for it), its
prompts are trained by the healthy one exactly once, it is named in the log, and it rejoins
only after a weight refit. Rejoin probes never hold the learner's lock, and the verdict
"did not come back" is reached at the deadline, with no probe past it."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.types import WeightUpdateReport
from tests.unit.coordinator.fakes import FakeLearner, FakeReward, FakeRollout, Unavailable, records

STALL_S = 20.0


class FakeClock:
    """Monotonic seconds that move only when a fake says so (a probe waiting its deadline)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


class HangingRollout(FakeRollout):
    """Serves normally until ``hang()``; then (SIGSTOP) its generate calls never return and
    its probes time out, each moving the fake clock by the probe's deadline, until
    ``wake()`` (SIGCONT): a hung call then returns what it generated, which must be dropped."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.stopped = threading.Event()
        self.awake = threading.Event()
        self.awake.set()
        self.num_hung_calls = 0
        self.num_probes_while_stopped = 0

    def hang(self) -> None:
        self.awake.clear()
        self.stopped.set()

    def hang_in_next_generate(self) -> None:
        """SIGSTOP lands while it holds its next request (before that, it serves)."""
        self.hang_next = True

    def wake(self) -> None:
        self.stopped.clear()
        self.awake.set()

    hang_next = False

    def generate(self, prompts, params, request_id=""):
        if self.hang_next:
            self.hang_next = False
            self.hang()
        if self.stopped.is_set():
            self.num_hung_calls += 1
            self.awake.wait()
        return super().generate(prompts, params, request_id)

    wake_after_probes: int | None = None
    """SIGCONT once this many probes went unanswered (None: stays stopped)."""

    def status(self, timeout_s=None):
        if self.stopped.is_set():
            self.num_probes_while_stopped += 1
            self.clock.advance(timeout_s or 120.0)
            if self.num_probes_while_stopped == self.wake_after_probes:
                self.wake()
            raise Unavailable("deadline exceeded")
        return super().status(timeout_s)


class TargetedLearner(FakeLearner):
    """Publishes only to the targets named (``FakeLearner`` updates every replica); a
    publish to a stopped replica fails as the learner's Describe probe would. ``gate`` and
    ``gate_step``: see ``_gate``."""

    def __init__(self, rollouts, names: Sequence[str]) -> None:
        super().__init__(rollouts)
        self.by_name = dict(zip(names, rollouts))
        self.published: list[list[str]] = []
        self.gate = threading.Event()
        self.gate_step = 10**9

    def publish_weights(self, targets, catch_up=False):
        self.published.append(list(targets))
        for t in targets:
            replica = self.by_name[t]
            if isinstance(replica, HangingRollout) and replica.stopped.is_set():
                raise Unavailable(f"{t}: Describe probe timed out")
            replica.version = self.version
        return WeightUpdateReport(self.version, 8, 0.0)


class OwnedLock:
    """The learner's lock, knowing which thread holds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.owner = threading.get_ident()
        return got

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def __enter__(self) -> OwnedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _job(tmp_path, clock: FakeClock, **cfg):
    healthy, hanging = FakeRollout(), HangingRollout(clock)
    names = ["127.0.0.1:1001", "127.0.0.1:1002"]
    learner = TargetedLearner([healthy, hanging], names)
    svc = Services([healthy, hanging], FakeReward(), learner, names, lambda ids: str(ids[-1]))
    config = CoordinatorConfig(
        num_steps=8,
        prompts_per_step=4,
        prompts_per_request=2,
        group_size=2,
        progress=False,
        replica_stall_timeout_s=STALL_S,
        **cfg,
    )
    job = TrainingJob(config, svc, records(64), tmp_path)
    for d in job.dispatchers:
        d.clock = clock
        d.probe_interval_s = 0.01  # real seconds between probes; silence is on the fake clock
        d.rejoin_interval_s = 0.01
    return job, healthy, hanging, learner


def _gate(job: TrainingJob, learner: TargetedLearner) -> None:
    """Step ``learner.gate_step`` starts only once ``learner.gate`` is set (bounded), so a
    test sees the replica's rejoin decided before the run can end. It waits where the trainer
    loop waits between steps, outside the learner's lock, which the rejoin needs."""
    control, real = job.control, job.control.wait_to_continue
    num_calls = [0]

    def wait_to_continue() -> bool:
        num_calls[0] += 1
        if num_calls[0] == learner.gate_step:
            assert learner.gate.wait(60), "the gated event never happened"
        return real()

    control.wait_to_continue = wait_to_continue  # type: ignore[method-assign]


def _audit(tmp_path) -> Counter[int]:
    import json

    lines = [json.loads(x) for x in (tmp_path / "trained.jsonl").read_text().splitlines()]
    return Counter(x["seq"] for x in lines)


def test_stopped_replica_leaves_within_the_bound_and_its_prompts_train_once(tmp_path, caplog):
    clock = FakeClock()
    job, healthy, hanging, learner = _job(tmp_path, clock, replica_rejoin_timeout_s=0)
    hanging.hang_in_next_generate()
    with caplog.at_level(logging.WARNING):
        summary = job.run()
    hanging.wake()
    stalled = job.dispatchers[1]
    assert summary.num_steps == 8
    assert stalled.failed and stalled.num_stalled == 1 and hanging.num_hung_calls == 1
    # Out once the fake clock passed the bound: at most one probe interval's deadline more.
    assert STALL_S <= clock() <= STALL_S + stalled.probe_timeout_s
    assert summary.num_requeued == 2  # the hung request's prompts, trained by the healthy one
    seqs = _audit(tmp_path)
    assert len(seqs) == 8 * 4 and set(seqs.values()) == {1}  # exactly once
    assert "127.0.0.1:1002" in caplog.text and "stopped answering" in caplog.text
    assert "127.0.0.1:1002" not in learner.published[-1]  # left the weight-sync set


def test_stalled_replica_rejoins_only_after_a_refit(tmp_path):
    clock = FakeClock()
    job, healthy, hanging, learner = _job(tmp_path, clock, replica_rejoin_timeout_s=600)
    stalled = job.dispatchers[1]
    num_stall_probes = int(STALL_S / stalled.probe_timeout_s)
    hanging.hang_in_next_generate()
    hanging.wake_after_probes = num_stall_probes + 2  # SIGCONT during its rejoin probes
    real_rejoined = stalled.rejoined

    def rejoined(version):
        real_rejoined(version)
        learner.gate.set()

    stalled.rejoined = rejoined  # type: ignore[method-assign]
    learner.gate_step = 6  # the run cannot end before the replica is back
    _gate(job, learner)
    summary = job.run()
    assert summary.num_steps == 8 and stalled.num_stalled == 1 and stalled.num_rejoined == 1
    assert ["127.0.0.1:1002"] in learner.published  # the refit that let it back
    assert summary.staleness_histogram == {"0": 8 * 4}  # nothing trained under old weights
    seqs = _audit(tmp_path)
    assert len(seqs) == 8 * 4 and set(seqs.values()) == {1}  # the dropped reply trained none


def test_rejoin_probes_never_hold_the_learner_lock_and_stop_at_the_deadline(tmp_path, caplog):
    clock = FakeClock()
    job, healthy, hanging, learner = _job(tmp_path, clock, replica_rejoin_timeout_s=60)
    job.publisher.learner_lock = lock = OwnedLock()
    hanging.hang_in_next_generate()  # never wakes
    probes: list[tuple[float, float, bool]] = []  # (clock at the probe, its deadline, locked)
    probe = hanging.status

    def watched_status(timeout_s=None):
        probes.append((clock(), timeout_s or 0.0, lock.owner == threading.get_ident()))
        return probe(timeout_s)

    hanging.status = watched_status
    stalled = job.dispatchers[1]
    real_wait = stalled._wait_for_rejoin
    verdict_at: list[float] = []

    def wait_for_rejoin():
        verdict_at.append(clock())
        back = real_wait()
        learner.gate.set()
        return back

    stalled._wait_for_rejoin = wait_for_rejoin
    learner.gate_step = 3
    _gate(job, learner)
    with caplog.at_level(logging.INFO):
        summary = job.run()
    hanging.wake()
    assert summary.num_steps == 8 and stalled.failed
    assert "did not come back within 60s" in caplog.text and "127.0.0.1:1002" in caplog.text
    assert not any(locked for _, _, locked in probes)  # no probe inside the critical section
    assert "127.0.0.1:1002" not in learner.published[-1]
    # No rejoin probe outlasts the deadline: the verdict is reached at it, not after.
    (start,) = verdict_at
    rejoin_probes = [(at, t) for at, t, _ in probes if at >= start]
    assert rejoin_probes and all(at + t <= start + 60 + 1e-9 for at, t in rejoin_probes)
    assert clock() == start + 60
