"""Admission control and the buffer of scored, untrained groups (the async schedule's state).

Invariants (tested in tests/unit/coordinator/test_async.py):
- Capacity rule (AReaL): at most ``(published_step + lead + 1) * batch_groups`` groups are
  ever started (and never more than the run's ``num_steps`` batches), where ``published_step`` counts the train steps whose weights the replicas
  have and ``lead <= bound.max_steps`` (greedy admission: lead = bound.max_steps; paced:
  chosen by ``pacing.Pacer``). A group started under weights of step p therefore
  belongs to one of the batches up to p + lead + 1 when batches are taken oldest-first, so
  finished work is not wasted. Lowering the lead never takes back a started group.
- Batches are taken oldest policy version first, FIFO within a version.
- A group more than ``bound.max_versions`` versions behind the learner is never trained: it
  is handed back for re-generation and counted (``dropped_stale``); nothing is lost. The
  bound (``staleness.StalenessBound``) is fixed when the admission is made; nothing rewrites
  it.
- Dispatchers ask for prompts through ``admit`` (blocking) or ``try_admit``; the lock and
  its conditions are the buffer's own.
- Every prompt handed out and not yet trained is in exactly one place: in flight (admitted
  by a dispatcher, not yet back), buffered (scored), re-queued, or filtered and not yet
  written to the audit (dynamic sampling, ``dynamic_sampling.py``). ``pending()`` lists them
  all: what a checkpoint must regenerate on resume.
- A filtered group frees its admission slot: a new prompt takes its place.
- Pacing observations: time dispatchers spend blocked by admission, and per taken batch how
  long it had been complete, are measured here on one clock (``clock``) and handed to the
  pacer after each step (``pace``).
Thread-safe; no clients, no RL math.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hybridflow.coordinator.dataflow import Prompt, ScoredGroup
from hybridflow.coordinator.dynamic_sampling import GroupFilter
from hybridflow.coordinator.pacing import Pacer, StepObservation
from hybridflow.coordinator.staleness import StalenessBound


class StopFlag(Protocol):
    """What ``admit`` watches to return early: a ``threading.Event``, or a dispatcher's
    stop (the job's stop or its replica's drain)."""

    def is_set(self) -> bool: ...


@dataclass
class BufferStats:
    """Counters of the buffer for the step metrics: groups dropped as too stale and the
    staleness histogram of trained groups."""

    dropped_stale: int = 0
    staleness: Counter[int] = field(default_factory=Counter)
    """Trained groups by staleness (learner version at training - generating version)."""


class Admission:
    """How many more groups may start generating, given the published weights and the
    staleness bound (which it holds, fixed)."""

    def __init__(
        self,
        batch_groups: int,
        bound: StalenessBound,
        lead_steps: int | None = None,
        max_groups: int | None = None,
    ) -> None:
        """``lead_steps``: how far ahead generation may start (None: greedy, the bound).
        ``max_groups``: groups the run will ever train (num_steps batches); nothing starts
        beyond them, so the last step leaves no generation behind (None: no cap)."""
        self.batch_groups = batch_groups
        self.bound = bound
        self.lead_steps = lead_steps
        self.max_groups = max_groups
        self.num_started = 0
        self.published_step = 0

    def lead(self) -> int:
        """The lead in effect: the pacer's, never past the hard bound."""
        if self.lead_steps is None:
            return self.bound.max_steps
        return min(self.lead_steps, self.bound.max_steps)

    def capacity(self) -> int:
        limit = (self.published_step + self.lead() + 1) * self.batch_groups
        if self.max_groups is not None:
            limit = min(limit, self.max_groups)
        return max(0, limit - self.num_started)

    def start(self, num: int) -> None:
        assert num <= self.capacity(), "admission: started beyond capacity"
        self.num_started += num

    def give_back(self, num: int) -> None:
        """Groups that will be re-generated (failure or staleness) free their slot."""
        self.num_started -= num
        assert self.num_started >= 0


class GroupBuffer:
    """Scored groups waiting for the learner, with the admission state, under one lock.

    Two conditions on that lock keep wake-ups targeted: one wakes dispatchers when capacity
    frees up (publish, re-queue), the other the trainer when groups arrive. A finished group
    then wakes one thread, not every replica's dispatcher. ``lock`` is public for one reader:
    a checkpoint's consistent cut of ``pending()`` and the cursor (``schedule_state.py``).
    """

    def __init__(
        self,
        admission: Admission,
        clock: Callable[[], float] = time.monotonic,
        group_filter: GroupFilter | None = None,
    ) -> None:
        """``group_filter``: dynamic sampling (None: every group is trained)."""
        self.admission = admission
        self.group_filter = group_filter
        self.clock = clock
        self.lock = threading.Lock()
        self._capacity_freed = threading.Condition(self.lock)
        self._groups_ready = threading.Condition(self.lock)
        self._groups: list[tuple[int, int, ScoredGroup]] = []  # (version, arrival, group)
        self._arrivals = 0
        self._arrived_at: dict[int, float] = {}  # arrival -> clock time
        self._requeued: list[Prompt] = []
        self._filtered: list[ScoredGroup] = []  # filtered, not yet audited
        self._in_flight: dict[int, Prompt] = {}  # id(prompt) -> prompt
        self.stats = BufferStats()
        self._blocked_since: dict[int, float] = {}  # dispatcher -> blocked by admission since
        self._blocked_done_s = 0.0
        self._take_at = clock()
        self._take_blocked_s = 0.0
        self.last_take = StepObservation(wait_s=0.0, slack_s=0.0, blocked_s=0.0, period_s=0.0)
        """The last batch taken: its slack, blocked time and period (``wait_s`` unused)."""

    def __len__(self) -> int:
        with self.lock:
            return len(self._groups)

    @property
    def bound(self) -> StalenessBound:
        """The run's staleness bound (fixed)."""
        return self.admission.bound

    def admit(
        self,
        dispatcher: int,
        size: Callable[[], int],
        handouts: Callable[[int], Sequence[Prompt]],
        stop: StopFlag,
    ) -> list[Prompt]:
        """Blocks until the capacity rule lets dispatcher ``dispatcher`` start some prompts:
        up to ``size()`` of them, re-queued ones first, then ``handouts(n)`` new ones. The
        time it waits counts as admission-blocked (pacing). [] once ``stop`` is set."""
        with self.lock:
            while not stop.is_set():
                prompts = self._admit_locked(dispatcher, size(), handouts)
                if prompts is not None:
                    return prompts
                self._capacity_freed.wait(0.5)
            self.set_blocked(dispatcher, False)
        return []

    def try_admit(
        self, dispatcher: int, size: int, handouts: Callable[[int], Sequence[Prompt]]
    ) -> list[Prompt]:
        """``admit`` without waiting: the prompts that may start now, [] (and counted as
        blocked from now) when none may."""
        with self.lock:
            return self._admit_locked(dispatcher, size, handouts) or []

    def _admit_locked(
        self, dispatcher: int, size: int, handouts: Callable[[int], Sequence[Prompt]]
    ) -> list[Prompt] | None:
        """The admitted prompts, None when there is no room (the dispatcher is blocked)."""
        room = min(size, self.admission.capacity())
        if room <= 0:
            self.set_blocked(dispatcher, True)
            return None
        self.set_blocked(dispatcher, False)  # admission-blocked time: pacing.py
        prompts = self._take_requeued(room)
        prompts += handouts(room - len(prompts))
        self.admission.start(len(prompts))
        for p in prompts:
            self._in_flight[id(p)] = p
        return prompts

    def put(self, groups: list[ScoredGroup]) -> None:
        with self.lock:
            for g in groups:
                self._in_flight.pop(id(g.prompt), None)
                # A group with nothing to train (every agent episode failed before its first
                # request) is audited as filtered, as a filtered group is: its prompt ended.
                empty = not g.completions
                if empty or (self.group_filter is not None and not self.group_filter.keep(g)):
                    self._filtered.append(g)
                    self.admission.give_back(1)  # a new prompt takes its place
                    self._capacity_freed.notify_all()
                    continue
                version = min(c.policy_version for c in g.completions)
                self._groups.append((version, self._arrivals, g))
                self._arrived_at[self._arrivals] = self.clock()
                self._arrivals += 1
            self._groups_ready.notify()

    def requeue(self, prompts: list[Prompt]) -> None:
        """Prompts to generate again (failed replica or stale); their slots are freed."""
        with self.lock:
            for p in prompts:
                self._in_flight.pop(id(p), None)
            self._requeued.extend(prompts)
            self.admission.give_back(len(prompts))
            self._capacity_freed.notify_all()

    def _take_requeued(self, num: int) -> list[Prompt]:
        taken, self._requeued = self._requeued[:num], self._requeued[num:]
        return taken

    def take_batch(
        self, num_groups: int, learner_version: int, timeout_s: float
    ) -> list[ScoredGroup] | None:
        """Oldest-first batch of ``num_groups`` groups within the bound of ``learner_version``,
        or None on timeout.

        Stale groups met on the way are handed back for re-generation and counted.
        """
        too_stale = self.bound.too_stale
        with self.lock:
            while True:
                self._groups.sort(key=lambda item: (item[0], item[1]))
                stale = [item for item in self._groups if too_stale(item[0], learner_version)]
                if stale:
                    for item in stale:
                        del self._arrived_at[item[1]]
                    self._groups = [
                        item for item in self._groups if not too_stale(item[0], learner_version)
                    ]
                    self.stats.dropped_stale += len(stale)
                    self._requeued.extend(g.prompt for _, _, g in stale)
                    self.admission.give_back(len(stale))
                    self._capacity_freed.notify_all()
                if len(self._groups) >= num_groups:
                    batch = self._groups[:num_groups]
                    self._groups = self._groups[num_groups:]
                    for version, _, _ in batch:
                        self.stats.staleness[learner_version - version] += 1
                    self._note_take(max(self._arrived_at.pop(a) for _, a, _ in batch))
                    if self.group_filter is not None:
                        self.group_filter.batch_taken()
                    return [g for _, _, g in batch]
                if not self._groups_ready.wait(timeout_s):
                    return None

    def _note_take(self, complete_at: float) -> None:
        """A batch complete since ``complete_at`` was taken: what the pacer sees of it."""
        now = self.clock()
        blocked = self._blocked_s(now)
        self.last_take = StepObservation(
            wait_s=0.0,
            slack_s=max(0.0, now - complete_at),
            blocked_s=blocked - self._take_blocked_s,
            period_s=now - self._take_at,
        )
        self._take_at, self._take_blocked_s = now, blocked

    def _blocked_s(self, now: float) -> float:
        return self._blocked_done_s + sum(now - t for t in self._blocked_since.values())

    def set_blocked(self, dispatcher: int, blocked: bool) -> None:
        """Dispatcher ``dispatcher`` waits for admission (True) or got prompts / stops
        (False). Caller holds ``lock`` (``admit`` does)."""
        if blocked:
            self._blocked_since.setdefault(dispatcher, self.clock())
        elif dispatcher in self._blocked_since:
            self._blocked_done_s += self.clock() - self._blocked_since.pop(dispatcher)

    def pace(self, pacer: Pacer, wait_s: float) -> int:
        """After a step: the pacer sees it (the learner waited ``wait_s`` for its batch) and
        admission takes the lead it answers, which is returned."""
        with self.lock:
            take = self.last_take
            lead = pacer.observe(
                StepObservation(wait_s, take.slack_s, take.blocked_s, take.period_s)
            )
            self.admission.lead_steps = lead
            self._capacity_freed.notify_all()
            return lead

    def publish(self, step: int) -> None:
        """The replicas now have the weights of train step ``step``."""
        with self.lock:
            self.admission.published_step = step
            self._capacity_freed.notify_all()

    def wake_all(self) -> None:
        """Wakes every waiting thread (the job is stopping)."""
        with self.lock:
            self._capacity_freed.notify_all()
            self._groups_ready.notify_all()

    def take_filtered(self) -> list[ScoredGroup]:
        """The groups filtered since the last call (the trainer loop audits them)."""
        with self.lock:
            taken, self._filtered = self._filtered, []
            return taken

    def pending(self) -> list[Prompt]:
        """Every prompt handed out and not trained (in flight, buffered, re-queued), in
        hand-out order when prompts carry a ``seq`` (cursor hand-outs do). Caller holds
        ``lock`` (a checkpoint reads this and the cursor as one snapshot)."""
        prompts = [
            *self._in_flight.values(),
            *(g.prompt for _, _, g in self._groups),
            *self._requeued,
            *(g.prompt for g in self._filtered),
        ]
        return sorted(prompts, key=lambda p: getattr(p, "seq", 0))

    def restore(self, requeued: Sequence[Prompt], num_started: int, published_step: int) -> None:
        """Resume: what was pending at the checkpoint is generated again first."""
        with self.lock:
            self._requeued = list(requeued)
            self.admission.num_started = num_started
            self.admission.published_step = published_step
            self._capacity_freed.notify_all()

    def drain(self) -> tuple[list[ScoredGroup], list[Prompt]]:
        """What is left at the end: finished-but-untrained groups and re-queued prompts."""
        with self.lock:
            groups = [g for _, _, g in self._groups]
            self._groups = []
            self._arrived_at.clear()
            return groups, list(self._requeued)
