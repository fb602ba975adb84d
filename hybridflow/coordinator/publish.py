"""Weights from the learner to the serving replicas, for the training job: ``WeightPublisher``.

What it keeps true (tested in tests/unit/coordinator/ and tests/fault/):
- A replica that fails a publish and does not answer leaves the set at once; its
  dispatcher waits for it to come back and ``rejoin``, which gives it the current weights.
- A publish that fails while every replica answers (one was just restarted) is tried again
  for up to ``service_wait_s``; closing the job (``stop``) ends the tries.
- A publish whose weights did not take effect (``DeliveryFailed``: the verified publisher's
  probe) is never retried: the run stops rather than train on against old weights.
- In an async run a learner that publishes in the background (``PublishesInBackground``)
  publishes beside the next train step, one publish in flight at a time; admission learns a
  step is out only once every target holds it.
- Liveness probes never run inside the learner's lock (``learner_lock``: the trainer loop,
  checkpoints, publishes and rejoins all call the learner under it).
- While a held-out evaluation holds the replicas' version (``hold``: ``evaluation.EvalHold``,
  taken by ``on_published`` right after the publish it evaluates), the next ``sync`` waits
  for it, at most until the evaluation's deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hybridflow.clients import PublishesInBackground
from hybridflow.coordinator.buffer import GroupBuffer
from hybridflow.coordinator.dispatch import ReplicaDispatcher, describe_error
from hybridflow.coordinator.events import EventLog
from hybridflow.coordinator.liveness import PROBE_TIMEOUT_S
from hybridflow.coordinator.services import Services
from hybridflow.errors import DeliveryFailed, ResourceExhausted, ServiceError

if TYPE_CHECKING:
    from hybridflow.coordinator.evaluation import EvalHold

log = logging.getLogger(__name__)


class WeightPublisher:
    """Publishes the learner's weights to the replicas whose dispatchers serve, and to a
    failed one when it rejoins. ``dispatchers`` is set by the job once it has made them
    (they call ``rejoin``)."""

    retry_s = 1.0
    """Pause between the tries of a publish that fails while every replica answers."""

    def __init__(
        self,
        services: Services,
        buffer: GroupBuffer,
        events: EventLog,
        stop: threading.Event,
        service_wait_s: float,
        overlap: bool,
    ) -> None:
        """``overlap``: a learner that can publish in the background does so beside the
        next train step (only worth it when that step may train before the publish ends)."""
        self.services = services
        self.buffer = buffer
        self.events = events
        self.dispatchers: Sequence[ReplicaDispatcher] = ()
        self.learner_lock = threading.Lock()
        self._stop = stop
        self._service_wait_s = service_wait_s
        self._overlap = overlap
        self._in_flight: threading.Thread | None = None
        """The background publish in flight (``sync``), until joined."""
        self._error: BaseException | None = None
        self.hold: EvalHold | None = None
        """An evaluation's hold on the replicas' version; ``sync`` waits while it is taken."""
        self.on_published: Callable[[int], None] | None = None
        """Called with the step once a ``sync`` landed on every target (the job starts a
        due evaluation there, taking ``hold`` before the next sync can run)."""
        self.hold_wait_s = 0.0
        """Seconds ``sync`` waited for evaluations, in all."""

    def rejoin(self, index: int, timeout_s: float) -> int | None:
        """A failed replica is back when it answers a probe (outside the learner's lock, so
        a dead one costs the learner nothing); then it gets the current weights. Returns
        the version it now holds, None while it is not back; waits at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        if not _alive(self.dispatchers[index], min(PROBE_TIMEOUT_S, timeout_s)):
            return None
        if not self.learner_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return None
        try:
            report = self.services.learner.publish_weights(
                [self.services.weight_targets[index]], catch_up=True
            )
            self.dispatchers[index].rejoined(report.policy_version)  # before the next publish
        finally:
            self.learner_lock.release()
        return report.policy_version

    def publish(self) -> None:
        """Weights to every serving replica, synchronously: drops the dead, retries while
        every replica answers. The probes run after the learner's lock is released."""
        deadline = time.monotonic() + self._service_wait_s
        while True:
            try:
                with self.learner_lock:  # the serving set read under it: see ``rejoin``
                    serving = [d for d in self.dispatchers if not d.failed]
                    if not serving:
                        return  # nobody to send to; rejoining replicas get weights when back
                    targets = [self.services.weight_targets[d.index] for d in serving]
                    report = self.services.learner.publish_weights(targets)
                for d in serving:
                    d.note_published(report.policy_version)
                return
            except DeliveryFailed:
                raise  # the weights did not take effect: never train on as if they had
            except ServiceError as exc:
                dead = [d for d in serving if not _alive(d)]
                for d in dead:
                    if d.mark_failed():  # its dispatcher waits to rejoin
                        log.warning(
                            "%s unreachable during a weight publish (%s); it rejoins with "
                            "the current weights when it is back",
                            d.replica_name,
                            describe_error(exc),
                        )
                if not dead:
                    if time.monotonic() > deadline or self._stop.is_set():
                        raise  # past the wait, or the job is closing (a publish thread)
                    log.warning("weight publish failed (%s); retrying", describe_error(exc))
                    self._stop.wait(self.retry_s)

    def sync(self, step: int, version: int, since: float) -> None:
        """Step ``step``'s weights (``version``) to the serving replicas. With ``overlap``,
        a learner that publishes in the background is asked to start, which returns once
        its weights are snapshotted, and a thread waits for the end while the next step
        trains; the replicas are noted at ``version`` and the buffer learns the step is out
        only once every target holds it. The next publish, a checkpoint and the job's
        close ``join`` the one in flight first; an evaluation's ``hold`` is waited for."""
        self.join()
        if self.hold is not None and self.hold.taken:
            start = time.time()
            waited = self.hold.wait()
            self.hold_wait_s += waited
            self.events.record("eval_hold", start, time.time(), step=step)
        learner = self.services.learner
        if self._overlap and isinstance(learner, PublishesInBackground):
            serving: list[ReplicaDispatcher] = []
            try:
                with self.learner_lock:  # the serving set read under it: see ``rejoin``
                    serving = [d for d in self.dispatchers if not d.failed]
                    if serving:
                        learner.start_publish(
                            [self.services.weight_targets[d.index] for d in serving]
                        )
            except ServiceError as exc:
                log.warning("weight publish did not start (%s)", describe_error(exc))
                serving = []
            if serving:
                self._follow(learner, serving, step, version, since)
                return
        self.publish()
        self._published(step, version, since)

    def started(
        self, step: int, version: int, serving: Sequence[ReplicaDispatcher], since: float
    ) -> None:
        """Step ``step``'s publish to ``serving``, which the learner began itself as the step
        ended (``TrainsAhead``, once the publish before it was reported): followed to its
        end beside the next step, as ``sync`` does with the one it starts."""
        self.join()
        learner = self.services.learner
        assert isinstance(learner, PublishesInBackground)
        self._follow(learner, serving, step, version, since)

    def _follow(
        self,
        learner: PublishesInBackground,
        serving: Sequence[ReplicaDispatcher],
        step: int,
        version: int,
        since: float,
    ) -> None:
        self._in_flight = threading.Thread(
            target=self._complete,
            args=(learner, serving, step, version, since),
            name="weight-publish",
            daemon=True,
        )
        self._in_flight.start()

    def join(self) -> None:
        """Waits for the background publish in flight (bounded: its learner call has a
        deadline) and raises what failed it."""
        thread, self._in_flight = self._in_flight, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"weight publish failed: {error}") from error

    def _complete(
        self,
        learner: PublishesInBackground,
        serving: Sequence[ReplicaDispatcher],
        step: int,
        version: int,
        since: float,
    ) -> None:
        """The publish thread: waits for the learner's report, notes the replicas, frees
        admission. A failed background publish is done again synchronously (``publish``:
        the dead replica leaves the set, the others get the then current weights, whose
        version its report gives)."""
        try:
            try:
                report = learner.finish_publish()
                for d in serving:
                    d.note_published(report.policy_version)
            except DeliveryFailed:
                raise
            except ServiceError as exc:
                log.warning("background weight publish failed (%s); again", describe_error(exc))
                self.publish()
            self._published(step, version, since)
        except BaseException as exc:  # noqa: BLE001 — raised by the trainer loop's next join
            self._error = exc

    def _published(self, step: int, version: int, since: float) -> None:
        self.buffer.publish(step)
        self.events.record("sync", since, time.time(), step=step, version=version)
        if self.on_published is not None:
            self.on_published(step)


def _alive(dispatcher: ReplicaDispatcher, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the dispatcher's replica answers a status call now. A replica that sheds the
    probe (``ResourceExhausted``: at its concurrency limit) is busy, not gone."""
    try:
        dispatcher.rollout.status(timeout_s=timeout_s)
    except ResourceExhausted:
        return True
    except ServiceError:
        return False
    return True
