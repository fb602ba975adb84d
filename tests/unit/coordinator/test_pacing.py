"""Paced admission: the pacer's rule, and the real Admission + GroupBuffer + Pacer driven by a
discrete-event schedule on a fake clock (no threads, no sleeps, no wall-clock asserts).

``simulate`` mirrors the trainer loop (take the oldest batch, train, publish, pace) and the
dispatchers (admit up to ``chunk`` groups, generate, put; block on admission otherwise) with
given generation and train times, so throughput and staleness are exact numbers.
"""

from __future__ import annotations

import heapq
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from hybridflow.coordinator.buffer import Admission, GroupBuffer
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.dataflow import ScoredGroup
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.pacing import Pacer, StepObservation
from hybridflow.coordinator.services import Services
from hybridflow.coordinator.staleness import StalenessBound

from .fakes import FakeLearner, FakeReward, FakeRollout, records

# --------------------------------------------------------------------- the rule itself


def obs(wait=0.0, slack=0.0, blocked=0.0, period=1.0) -> StepObservation:
    return StepObservation(wait_s=wait, slack_s=slack, blocked_s=blocked, period_s=period)


def test_pacer_starts_at_one_and_raises_only_when_pacing_cost_a_wait():
    pacer = Pacer(max_lead=3)
    assert pacer.lead == 1
    assert pacer.observe(obs(wait=0.5)) == 1  # nobody blocked: generation is the bottleneck
    assert pacer.observe(obs(blocked=2.0)) == 1  # blocked but the learner did not wait
    assert pacer.observe(obs(wait=0.01, blocked=2.0)) == 1  # wait under 5 % of the period
    assert pacer.observe(obs(wait=0.5, blocked=0.5)) == 2
    assert pacer.observe(obs(wait=0.5, blocked=0.5)) == 3
    assert pacer.observe(obs(wait=0.5, blocked=0.5)) == 3  # the bound
    assert pacer.num_raised == 2


def test_pacer_lowers_only_after_patience_steps_of_more_than_a_step_of_slack():
    pacer = Pacer(max_lead=2, patience=3)
    pacer.lead = 2
    for _ in range(5):  # ready 1.2 steps early: one step less lead could have waited
        assert pacer.observe(obs(slack=1.2)) == 2
    assert pacer.observe(obs(slack=1.3)) == 2
    assert pacer.observe(obs(slack=1.3)) == 2
    assert pacer.observe(obs(wait=0.5)) == 2  # a wait without blocking resets the count
    assert [pacer.observe(obs(slack=1.3)) for _ in range(3)] == [2, 2, 1]
    assert [pacer.observe(obs(slack=5.0)) for _ in range(3)] == [1, 1, 1]  # the floor


def test_pacer_slack_threshold_scales_with_sync_every():
    pacer = Pacer(max_lead=3, sync_every=2)
    pacer.lead = 3
    assert [pacer.observe(obs(slack=2.4)) for _ in range(4)] == [3, 3, 3, 3]
    assert [pacer.observe(obs(slack=2.6)) for _ in range(3)] == [3, 3, 2]


def test_pacer_bounds_greedy_and_synchronous():
    assert Pacer(max_lead=0).lead == 0
    assert Pacer(max_lead=0).observe(obs(wait=1.0, blocked=1.0)) == 0  # k = 0 stays sync
    greedy = Pacer(max_lead=2, greedy=True)
    assert greedy.lead == 2
    assert greedy.observe(obs(slack=100.0)) == 2 and greedy.observe(obs(wait=1, blocked=1)) == 2
    pacer = Pacer(max_lead=StalenessBound(4, versions_per_step=2).max_steps)
    pacer.lead = 2  # two versions per step: max_staleness 4 is 2 steps
    assert pacer.observe(obs(wait=1.0, blocked=1.0)) == 2
    with pytest.raises(ValueError):
        Pacer(max_lead=-1)


def test_admission_lead_never_exceeds_the_bound_and_none_is_greedy():
    for k in range(4):
        for published in range(3):
            greedy = Admission(batch_groups=4, bound=StalenessBound(k))
            greedy.published_step = published
            assert greedy.capacity() == (published + k + 1) * 4  # unchanged rule
            for lead in range(6):
                paced = Admission(4, StalenessBound(k), lead_steps=lead)
                paced.published_step = published
                assert paced.lead() == min(lead, k)
                assert paced.capacity() == (published + min(lead, k) + 1) * 4


def test_config_admission_is_validated():
    assert CoordinatorConfig().admission == "pace"
    CoordinatorConfig(admission="greedy").validate()
    with pytest.raises(ValueError, match="coordinator.admission: must be one of pace, greedy"):
        CoordinatorConfig(admission="eager").validate()


# --------------------------------------------------------------------- the schedule


@dataclass
class Sim:
    """What a simulated run saw."""

    end_s: float
    step_end_s: list[float]
    leads: list[int]
    staleness: Counter[int]
    learner_wait_s: list[float]
    max_started_over_bound: int = 0
    dropped_stale: int = 0
    trained: list[int] = field(default_factory=list)

    def steps_per_s(self, skip: int) -> float:
        """Steady-state rate: steps after the first ``skip`` over their time."""
        return (len(self.step_end_s) - skip) / (self.step_end_s[-1] - self.step_end_s[skip - 1])

    def mean_staleness(self) -> float:
        return sum(k * n for k, n in self.staleness.items()) / sum(self.staleness.values())


def simulate(
    *,
    num_steps: int,
    batch_groups: int,
    chunk: int,
    gen_s: Callable[[int, int], float],
    num_replicas: int,
    train_s: float,
    max_staleness: int,
    greedy: bool = False,
    sync_every: int = 1,
    tolerance: float = 0.05,
) -> Sim:
    """One run on a fake clock: ``gen_s(replica, request)`` seconds per request of ``chunk``
    groups, ``train_s`` per step; a group's version is the published one when it started.
    ``tolerance=inf``: the lead never rises (held at 1)."""
    now = [0.0]
    pacer = Pacer(max_staleness, sync_every, greedy, tolerance=tolerance)
    bound = StalenessBound(max_staleness)
    buf = GroupBuffer(Admission(batch_groups, bound, pacer.lead), clock=lambda: now[0])
    events: list[tuple[float, int, str, int, list[ScoredGroup]]] = []
    seq = [0]
    requests = [0] * num_replicas
    idle = set(range(num_replicas))
    published_version = 0
    learner_version = 0
    step = 0
    waiting_since: float | None = 0.0  # the learner wants batch 1 from t = 0
    sim = Sim(0.0, [], [], Counter(), [])
    next_prompt = [0]

    def push(at: float, kind: str, who: int, groups: list[ScoredGroup]) -> None:
        seq[0] += 1
        heapq.heappush(events, (at, seq[0], kind, who, groups))

    def new_prompts(num: int) -> list[SimpleNamespace]:
        first = next_prompt[0]
        next_prompt[0] += num
        return [SimpleNamespace(index=i, seq=i) for i in range(first, first + num)]

    def admit() -> None:
        for r in sorted(idle):
            prompts = buf.try_admit(r, chunk, new_prompts)
            if not prompts:
                continue  # blocked by admission (the buffer counts it)
            limit = (buf.admission.published_step + max_staleness + 1) * batch_groups
            sim.max_started_over_bound = max(
                sim.max_started_over_bound, buf.admission.num_started - limit
            )
            idle.discard(r)
            groups = [
                ScoredGroup(prompt, [SimpleNamespace(policy_version=published_version)], [])
                for prompt in prompts
            ]
            push(now[0] + gen_s(r, requests[r]), "generated", r, groups)
            requests[r] += 1

    def try_train() -> None:
        nonlocal waiting_since
        if waiting_since is None:
            return
        batch = buf.take_batch(batch_groups, learner_version, timeout_s=0)
        if batch is None:
            return
        sim.learner_wait_s.append(now[0] - waiting_since)
        sim.trained += [g.prompt.index for g in batch]
        waiting_since = None
        push(now[0] + train_s, "trained", -1, [])

    admit()
    while step < num_steps:
        now[0], _, kind, who, groups = heapq.heappop(events)
        if kind == "generated":
            buf.put(groups)
            idle.add(who)
            try_train()
        else:
            step += 1
            learner_version += 1
            if step % sync_every == 0:
                buf.publish(step)
                published_version = learner_version
            sim.leads.append(buf.pace(pacer, wait_s=sim.learner_wait_s[-1]))
            sim.step_end_s.append(now[0])
            waiting_since = now[0]
            try_train()
        admit()
    sim.end_s = now[0]
    sim.staleness = buf.stats.staleness
    sim.dropped_stale = buf.stats.dropped_stale
    return sim


def run_both(**kw) -> tuple[Sim, Sim]:
    return simulate(**kw), simulate(greedy=True, **kw)


def test_fast_generation_lead_stays_one_staleness_one_same_throughput():
    # Two replicas make a batch in 1 s, the learner needs 3 s a step.
    kw = dict(num_steps=60, batch_groups=4, chunk=2, num_replicas=2, train_s=3.0)
    pace, greedy = run_both(gen_s=lambda r, i: 1.0, max_staleness=2, **kw)
    assert set(pace.leads) == {1}
    assert set(pace.staleness) == {0, 1} and pace.staleness[0] == 4  # batch 1: v0 at v0
    assert pace.mean_staleness() <= 1.0
    assert greedy.staleness[2] >= 57 * 4  # greedy: nearly everything at the bound
    assert set(pace.learner_wait_s[1:]) == {0.0}  # the learner never waits after batch 1
    assert pace.steps_per_s(skip=5) == pytest.approx(greedy.steps_per_s(skip=5))
    assert pace.steps_per_s(skip=5) == pytest.approx(1 / 3.0)


def test_slow_generation_uniform_lead_one_already_keeps_replicas_busy():
    # Generation is the bottleneck (3 s a batch, 1 s training) and even: nothing to gain.
    kw = dict(num_steps=40, batch_groups=4, chunk=2, num_replicas=2, train_s=1.0)
    pace, greedy = run_both(gen_s=lambda r, i: 3.0, max_staleness=2, **kw)
    assert set(pace.leads) == {1}
    assert pace.steps_per_s(skip=5) == pytest.approx(greedy.steps_per_s(skip=5))
    assert pace.steps_per_s(skip=5) == pytest.approx(1 / 3.0)
    assert pace.staleness == greedy.staleness  # the replicas set the pace in both


def test_slow_generation_uneven_replicas_lead_rises_to_the_bound():
    # Three replicas, two of them three times slower than the third; together they make 0.83
    # batches/s against the learner's 2: generation is the bottleneck. With lead 1 the fast
    # replica sits blocked while the learner waits for the slow ones' groups; the pacer
    # raises the lead to the bound and matches greedy's throughput.
    kw = dict(num_steps=80, batch_groups=4, chunk=2, num_replicas=3, train_s=0.5)

    def gen(r: int, i: int) -> float:
        return 1.0 if r == 0 else 3.0

    pace, greedy = run_both(gen_s=gen, max_staleness=3, **kw)
    held = simulate(gen_s=gen, max_staleness=3, tolerance=float("inf"), **kw)
    assert set(held.leads) == {1}
    assert held.steps_per_s(skip=20) < 0.85 * greedy.steps_per_s(skip=20)  # what lead 1 costs
    assert pace.leads[-40:] == [3] * 40
    assert pace.steps_per_s(skip=20) >= 0.95 * greedy.steps_per_s(skip=20)
    assert max(pace.staleness) <= 3


@pytest.mark.parametrize("seed", range(6))
def test_jittery_generation_never_exceeds_the_bound(seed):
    rng = random.Random(seed)
    times = {(r, i): rng.uniform(0.2, 4.0) for r in range(3) for i in range(400)}
    k = rng.choice([1, 2, 3])
    kw = dict(num_steps=60, batch_groups=6, chunk=2, num_replicas=3, train_s=1.0)
    pace, greedy = run_both(gen_s=lambda r, i: times[r, i], max_staleness=k, **kw)
    for sim in (pace, greedy):
        assert sim.max_started_over_bound <= 0
        assert max(sim.staleness) <= k
        assert all(0 <= lead <= k for lead in sim.leads)
        assert len(set(sim.trained)) == len(sim.trained)  # stale: dropped, never trained
    assert set(greedy.leads) == {k}
    assert pace.steps_per_s(skip=10) >= 0.9 * greedy.steps_per_s(skip=10)


def test_max_staleness_zero_stays_synchronous():
    kw = dict(num_steps=20, batch_groups=4, chunk=2, num_replicas=2, train_s=1.0)
    for gen in (0.5, 3.0):
        pace, greedy = run_both(gen_s=lambda r, i, g=gen: g, max_staleness=0, **kw)
        assert set(pace.leads) == {0}
        assert set(pace.staleness) == {0} and set(greedy.staleness) == {0}
        assert pace.step_end_s == greedy.step_end_s  # same schedule exactly


def test_sync_every_two_raises_the_lead_to_keep_the_learner_busy():
    # With weights published every 2 steps, lead 1 leaves every other step without a
    # prefetched batch; the pacer finds lead 2 and keeps it (no oscillation).
    kw = dict(num_steps=60, batch_groups=4, chunk=2, num_replicas=2, train_s=3.0)
    pace = simulate(gen_s=lambda r, i: 1.0, max_staleness=2, sync_every=2, **kw)
    assert pace.leads[-40:] == [2] * 40
    assert set(pace.learner_wait_s[-40:]) == {0.0}


# --------------------------------------------------------------------- the job


def test_job_reports_the_lead_and_greedy_stays_selectable(tmp_path):
    for admission in ("pace", "greedy"):
        rollouts = [FakeRollout(), FakeRollout()]
        learner = FakeLearner(rollouts)
        svc = Services(rollouts, FakeReward(), learner, ["r0", "r1"], decode=lambda ids: str(ids))
        cfg = CoordinatorConfig(
            num_steps=6, prompts_per_step=4, group_size=2, progress=False,
            save_checkpoint=False, max_staleness=2, prompts_per_request=2, admission=admission,
        )  # fmt: skip
        run_dir = tmp_path / admission
        run_dir.mkdir()
        summary = TrainingJob(cfg, svc, records(48), run_dir).run()
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        leads = [row["async/lead_steps"] for row in rows]
        assert summary.num_steps == 6 and max(map(int, summary.staleness_histogram)) <= 2
        if admission == "greedy":
            assert set(leads) == {2.0}
        else:
            assert all(1.0 <= lead <= 2.0 for lead in leads)
