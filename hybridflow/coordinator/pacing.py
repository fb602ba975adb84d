"""Paced admission: how many steps ahead of the published weights generation may start.

The admission rule (``buffer.Admission``) lets ``(published_step + lead + 1) * batch_groups``
groups start. A group started under the weights of step p then belongs to a batch up to
p + lead + 1, trained by a learner at step p + lead: it trains at most ``lead`` steps stale.
The staleness bound in steps (``staleness.StalenessBound.max_steps``, k below) stays the hard
bound: the lead never exceeds it.

- **greedy** (``coordinator.admission: greedy``): lead = k. Every slot
  fills; when generation is faster than training nearly every group trains exactly k stale,
  for no throughput (the learner is the bottleneck either way).
- **pace** (the default): the lead adapts in ``[min(1, k), k]`` and starts at the floor.
  With lead 1, batch j starts generating once the weights of step j - 2 are published, i.e.
  while the learner trains step j - 1: the freshest schedule that still overlaps generation
  with training. When generation is faster than training, batch j is ready when step j - 1
  ends (staleness 1, the learner never waits); when it is slower, the replicas always have
  admitted work (they finish batch j after step j - 1 has published), so they never idle
  either. Only uneven work (one slow replica, jitter, ``sync_every > 1``) makes lead 1 cost
  throughput: some dispatchers sit blocked by admission while the learner waits for the last
  groups of its batch. Groups are taken oldest version first, not batch by batch, so a higher
  lead lets the blocked dispatchers make groups that stand in for the late ones.

The rule, from one ``StepObservation`` per step (fed by the trainer loop after each step):

- **raise** by 1 (at once, up to k) when the learner waited for its batch (``wait_s``) *and*
  dispatchers were blocked by admission (``blocked_s``, dispatcher-seconds) since the
  previous batch was taken, each over ``tolerance`` of the step period. A wait with nobody
  blocked is generation being the bottleneck; a higher lead would not shorten it.
- **lower** by 1 (down to the floor) after ``patience`` consecutive steps whose batch was
  complete more than ``(1 + margin) * sync_every`` step periods before the learner took it
  (``slack_s``). One step less lead admits each batch one publish (``sync_every`` steps)
  later, so such a batch would still have been ready: the lower lead provably would not have
  made the learner wait. Lowering on "the learner stopped waiting" alone would oscillate
  (lower, wait, raise, no wait, lower, ...); this counterfactual test leaves a dead band of
  one publish interval between raising and lowering, so a steady workload settles on one lead.

No threads, no clients, no clocks: numbers in, a lead out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

AdmissionPolicy = Literal["pace", "greedy"]
"""When generation may start within the staleness bound (``coordinator.admission``)."""
ADMISSION_POLICIES: tuple[str, ...] = get_args(AdmissionPolicy)


@dataclass(frozen=True)
class StepObservation:
    """What one train step saw of the schedule (seconds on the buffer's clock)."""

    wait_s: float
    """The learner waited this long for the step's batch."""
    slack_s: float
    """The batch was complete this long before the learner took it (about 0 if it waited)."""
    blocked_s: float
    """Dispatcher-seconds spent blocked by admission since the previous batch was taken."""
    period_s: float
    """Time since the previous batch was taken (one step period)."""


class Pacer:
    """The admission lead, adapted step by step (``greedy``: always the bound)."""

    def __init__(
        self,
        max_lead: int,
        sync_every: int = 1,
        greedy: bool = False,
        tolerance: float = 0.05,
        margin: float = 0.25,
        patience: int = 3,
    ) -> None:
        if max_lead < 0 or sync_every < 1 or patience < 1:
            raise ValueError("pacer: max_lead >= 0, sync_every >= 1 and patience >= 1")
        self.greedy = greedy
        self.sync_every = sync_every
        self.tolerance = tolerance
        self.margin = margin
        self.patience = patience
        self.max_lead = max_lead
        self.lead = max_lead if greedy else min(1, max_lead)
        self._calm_steps = 0
        self.num_raised = 0
        self.num_lowered = 0

    @property
    def min_lead(self) -> int:
        return min(1, self.max_lead)

    def observe(self, obs: StepObservation) -> int:
        """The lead for the steps to come, given what the last step saw."""
        if self.greedy:
            return self.lead
        floor = self.tolerance * obs.period_s
        if obs.wait_s > floor and obs.blocked_s > floor:
            self._calm_steps = 0
            if self.lead < self.max_lead:
                self.lead += 1
                self.num_raised += 1
            return self.lead
        if obs.slack_s > (1 + self.margin) * self.sync_every * obs.period_s:
            self._calm_steps += 1
        else:
            self._calm_steps = 0
        if self._calm_steps >= self.patience and self.lead > self.min_lead:
            self.lead -= 1
            self.num_lowered += 1
            self._calm_steps = 0
        return self.lead
