"""Sending the next train step while the current one trains (``coordinator.train_ahead``).

A learner service (``clients.TrainsAhead``) takes a step together with the policy version it
must start from and the replicas to publish to once it is done. So the job sends step s+1
while s trains: the learner goes from one step to the next without a round trip, the next
batch's transfer and the job's bookkeeping of step s run beside step s+1, and each publish
starts in the learner as its step ends (no StartPublish call).

What stays true (tested in tests/unit/coordinator/test_train_ahead.py):
- Steps train in order and once: each names its start version; the learner refuses a step
  it is past, one whose step before failed, and one whose caller gave it up.
- A sample's staleness is counted against the version its step starts from (the batch is
  taken for that version), so the bound holds as before.
- No step is sent ahead of a step that ends in a checkpoint (saved between it and the next),
  while a pause or stop is requested (the step already sent trains and is logged, then the
  job pauses or stops), when an evaluation is due (its hold on the replicas' version must be
  taken before the next publish starts), of a step whose publish goes through StartPublish
  (the learner must still hold that step's weights then), or past the last step.
- The next batch is sent ahead only if the buffer holds it before the current step ends;
  else the job handles the step first and then waits for a batch as before (admission may
  need the step's publish to be noted before the rollout can make that batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hybridflow.clients import PendingTrainStep, TrainsAhead
from hybridflow.coordinator.buffer import GroupBuffer
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.dataflow import ScoredGroup
from hybridflow.coordinator.dispatch import ReplicaDispatcher
from hybridflow.coordinator.publish import WeightPublisher
from hybridflow.coordinator.staleness import StalenessBound
from hybridflow.types import TrainSample, TrainStepResult


def ahead_learner(
    config: CoordinatorConfig, bound: StalenessBound, learner: object
) -> TrainsAhead | None:
    """``learner`` when the job sends steps ahead: ``train_ahead`` with ``overlap_publish``,
    an asynchronous bound, no dynamic sampling (its filtered groups are audited per take),
    and a learner service that takes them; None: one step at a time."""
    if not (config.train_ahead and config.overlap_publish and bound.max_steps >= 1):
        return None
    if config.dynamic_sampling or not isinstance(learner, TrainsAhead):
        return None
    return learner


POLL_S = 0.01
"""How often the wait for the next batch looks whether the current step ended."""


@dataclass
class SentStep:
    """A step handed to the learner, until the job handles its result (``TrainingJob``)."""

    step: int
    batch: list[ScoredGroup]
    train_batch: list[TrainSample]
    t0: float
    """perf_counter when the job began to get its batch."""
    t1: float
    """perf_counter when it was handed to the learner."""
    w1: float
    """Wall clock when it was handed to the learner."""
    pending: PendingTrainStep | None = None
    """The call on its way (sent ahead); None: trained synchronously, ``result`` set."""
    result: TrainStepResult | None = None
    serving: list[ReplicaDispatcher] = field(default_factory=list)
    """The replicas the learner publishes to after the step ([]: the job publishes)."""

    @property
    def publishes(self) -> bool:
        """The learner starts this step's publish itself."""
        return bool(self.serving)

    def done(self) -> bool:
        return self.pending is None or self.pending.done()

    def wait(self) -> TrainStepResult:
        if self.result is None:
            assert self.pending is not None
            self.result = self.pending.result()
        return self.result

    def cancel(self) -> None:
        if self.pending is not None and self.result is None:
            self.pending.cancel()


class AheadRule:
    """When a step may be sent before the one ahead of it was handled, and when a step
    starts its own publish (the module docstring's list)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        control: JobControl,
        publisher: WeightPublisher,
        eval_due: Callable[[int], bool],
    ) -> None:
        """``eval_due(step)``: an evaluation is due at ``step`` (False when the job has none)."""
        self.config = config
        self.control = control
        self.publisher = publisher
        self.eval_due = eval_due

    def publishes_in_step(self, step: int) -> bool:
        """The learner starts ``step``'s publish as the step ends: it is a sync step, no
        evaluation holds the replicas' version, and none can start from the publish before
        it (which lands while this step trains) — those go through ``WeightPublisher.sync``,
        which waits for the hold."""
        every = self.config.sync_every
        if step % every != 0:
            return False
        hold = self.publisher.hold
        if hold is not None and hold.taken:
            return False
        # The publish before (step - every) evaluates the steps due since the one before it.
        return not any(self.eval_due(s) for s in range(step - 2 * every + 1, step - every + 1))

    def may_send_after(self, sent: SentStep) -> bool:
        """Whether the step after ``sent`` may go to the learner before ``sent`` is handled."""
        cfg, step = self.config, sent.step
        if step >= cfg.num_steps:
            return False
        if step % cfg.sync_every == 0 and not sent.publishes:
            return False  # its publish starts once it is handled: the learner must wait
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            return False
        if any(self.eval_due(s) for s in range(step - cfg.sync_every + 1, step + 1)):
            return False  # its publish starts the evaluation, which the next one must wait for
        return not (self.control.pause_requested or self.control.stop_requested)


def take_ahead(
    buffer: GroupBuffer, num_groups: int, version: int, current: SentStep
) -> list[ScoredGroup] | None:
    """The next batch (for a step starting from ``version``), if the buffer holds it
    before ``current`` ends; None otherwise."""
    while not current.done():
        batch = buffer.take_batch(num_groups, version, POLL_S)
        if batch is not None:
            return batch
    return None
