"""Deterministic fake services for schedule tests (the real ones run in integration/e2e)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow import errors
from hybridflow.types import (
    Completion,
    LearnerNeeds,
    RolloutStatus,
    SamplingParams,
    ScoreItem,
    ScoreResult,
    TrainSample,
    TrainStepResult,
    WeightUpdateReport,
)
from hybridflow.utils import manifest


@dataclass
class Record:
    prompt_text: str
    prompt_ids: list[int]
    data_source: str = "arith"
    ground_truth: str | None = "1"
    extra_info: dict = field(default_factory=dict)
    index: int = 0


def records(num: int) -> list[Record]:
    return [Record(f"p{i}", [i + 1], index=i) for i in range(num)]


class Unavailable(errors.Unavailable):
    """What a client raises for a replica that is gone (transport-free, ``hybridflow.errors``)."""


class FakeRollout:
    """Answers each prompt [x] with n completions [x, k]; version set by the learner."""

    def __init__(self, fail: bool = False) -> None:
        self.version = 0
        self.fail = fail
        self.prompts_seen: list[list[int]] = []
        self.requests: list[tuple[int, SamplingParams]] = []
        """(prompts, sampling) of every Generate call, in call order."""
        self.request_ids: list[str] = []
        """The request id of each of ``requests`` (an evaluation's start with ``eval``)."""
        self.job: Any = None
        self.learner: Any = None
        """The job and learner it serves, where a test needs them (set by the test)."""

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, request_id: str = ""
    ):
        if self.fail:
            raise Unavailable()
        self.prompts_seen.extend(list(p) for p in prompts)
        self.requests.append((len(prompts), params))
        self.request_ids.append(request_id)
        return [
            [Completion([p[0], k], [-0.5, -0.5], "stop", self.version) for k in range(params.n)]
            for p in prompts
        ]

    def status(self, timeout_s: float | None = None) -> RolloutStatus:
        return RolloutStatus("fake", "fake", self.version, 0, 10)


class FakeReward:
    def score_batch(self, items: list[ScoreItem]) -> list[ScoreResult]:
        return [ScoreResult(1.0 if it.response.endswith("0") else 0.0) for it in items]


class FakeLearner:
    """Counts versions; its train state (the version) is a real file under ``root``, laid
    out like the learner's (``<name>/MANIFEST.json``, ``<name>/COMPLETE``, verified on load), so
    resume runs against it."""

    def __init__(self, rollouts: list[FakeRollout], root: Path | None = None) -> None:
        self.version = 0
        self.batches: list[list[TrainSample]] = []
        self.rollouts = rollouts
        self.checkpoints: list[str] = []
        """Paths of the Hugging Face exports (``save_checkpoint``)."""
        self.saved: list[str] = []
        """Names of the train states saved (``save_train_state``), in order."""
        self.published: list[int] = []
        """The version of every weight publish, in order."""
        self.root = root
        self.fail_at_step: int | None = None
        """train_step raises UNAVAILABLE on this call number (a learner that died)."""
        self.greedy_baseline = False
        """What ``needs_greedy_baseline`` answers (a ReMax learner says True)."""

    def train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        if self.fail_at_step is not None and len(self.batches) + 1 >= self.fail_at_step:
            raise Unavailable()
        self.batches.append(samples)
        self.version += 1
        return TrainStepResult(self.version, {"actor/pg_loss": 0.1})

    def schedule_needs(self) -> LearnerNeeds:
        return LearnerNeeds(greedy_baseline=self.greedy_baseline)

    def compute_logprobs(self, prompts, responses, temperature):
        return [[-0.5] * len(r) for r in responses]

    def publish_weights(self, targets: Sequence[str], catch_up: bool = False) -> WeightUpdateReport:
        self.published.append(self.version)
        for r in self.rollouts:
            r.version = self.version
        return WeightUpdateReport(self.version, 8, 0.0)

    def save_checkpoint(self, path: str) -> str:
        self.checkpoints.append(path)
        return path

    def save_train_state(self, name: str) -> int:
        assert self.root is not None, "FakeLearner(root=...) to checkpoint"
        directory = self.root / name
        directory.mkdir(parents=True)
        self.saved.append(name)
        (directory / "version").write_text(str(self.version))
        manifest.write_manifest(directory, manifest.hash_files(directory, ["version"]))
        (directory / "COMPLETE").write_text("ok")
        return self.version

    def load_train_state(self, name: str) -> int:
        assert self.root is not None
        manifest.verify(self.root / name)  # like the learner: refused before it loads
        self.version = int((self.root / name / "version").read_text())
        return self.version


class InvalidArgument(errors.BadRequest):
    """What a client raises for refused input."""


class HandOutOrder:
    """Makes the replicas' requests generate and land in the buffer in hand-out order.

    Thread scheduling decides when a dispatcher calls ``generate`` after admitting prompts,
    so without this a request admitted first may be generated after a weight publish and
    arrive newer than one admitted after it (oldest-first training then takes the later
    one first). Here a request waits in ``generate`` until every prompt handed out before it
    is in the buffer (``wrap_put`` counts them), so policy versions and arrivals follow the
    cursor's order whatever the machine's load. ``open()`` lets everything through (the run
    is ending). ``expected`` is the hand-out sequence of prompt ids (a twin cursor's).
    """

    def __init__(self, expected: list[list[int]], timeout_s: float = 60.0) -> None:
        self._expected = expected
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._next = 0  # prompts put into the buffer so far
        self._busy = False  # a request is between its turn and its put
        self._open = False
        self.num_in_order = 0
        """Requests that went through in turn (before ``open``)."""

    def _is_next(self, prompts: list[list[int]]) -> bool:
        return self._expected[self._next : self._next + len(prompts)] == prompts

    def wait_turn(self, prompts: Sequence[Sequence[int]]) -> None:
        wanted = [list(p) for p in prompts]
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._open or (not self._busy and self._is_next(wanted)),
                self._timeout_s,
            )
            if not ok:  # reported to the trainer loop as a fatal dispatcher error
                raise InvalidArgument(
                    f"request {wanted} never became next (put so far: {self._next})"
                )
            if not self._open:
                self._busy = True
                self.num_in_order += 1

    def wrap_put(self, put: Callable[[list[Any]], None]) -> Callable[[list[Any]], None]:
        """``GroupBuffer.put`` that also moves the turn on once the groups are in."""

        def counted_put(groups: list[Any]) -> None:
            put(groups)
            with self._cond:
                if self._busy:
                    self._next += len(groups)
                    self._busy = False
                self._cond.notify_all()

        return counted_put

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()


class OrderedRollout(FakeRollout):
    """A FakeRollout that generates only when ``HandOutOrder`` says it is its turn."""

    def __init__(self, order: HandOutOrder) -> None:
        super().__init__()
        self.order = order

    def generate(self, prompts, params, request_id=""):
        self.order.wait_turn(prompts)
        return super().generate(prompts, params, request_id)


class BackgroundFakeLearner(FakeLearner):
    """A ``FakeLearner`` that publishes in the background (``PublishesInBackground``, as
    ``LearnerCore``): ``start_publish`` snapshots the version, ``finish_publish`` hands it
    to the replicas. ``background`` lists the versions published so."""

    def __init__(self, rollouts: list[FakeRollout], root: Path | None = None) -> None:
        super().__init__(rollouts, root)
        self.background: list[int] = []
        self._started: int | None = None

    def start_publish(self, targets: Sequence[str]) -> int:
        self._started = self.version
        self.background.append(self.version)
        return self.version

    def finish_publish(self) -> WeightUpdateReport:
        version, self._started = self._started, None
        assert version is not None, "finish_publish without start_publish"
        for r in self.rollouts:
            r.version = version
        return WeightUpdateReport(version, 8, 0.0)


class FakePendingStep:
    """``PendingTrainStep`` for ``AheadFakeLearner``: set once by the step's thread."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: TrainStepResult | None = None
        self._error: BaseException | None = None
        self.cancelled = False

    def set(self, result: TrainStepResult | None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> TrainStepResult:
        assert self._done.wait(60.0), "the fake's train step never ended"
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        self.cancelled = True


class StepRefused(errors.FailedPrecondition):
    """What the learner service answers a step it will not run (its turn cannot come)."""


class AheadFakeLearner(BackgroundFakeLearner):
    """A ``BackgroundFakeLearner`` that also trains ahead (``TrainsAhead``, as the learner
    service): every step runs on a thread of its own once the learner holds its start
    version (refused once past it, after a failed step, or when cancelled first), and a
    step with replicas to publish to starts that publish as it ends, after the publish
    before it was finished."""

    WAIT_S = 30.0

    def __init__(self, rollouts: list[FakeRollout], root: Path | None = None) -> None:
        super().__init__(rollouts, root)
        self.cond = threading.Condition()
        self.in_flight = 0
        self.sent: list[tuple[int, int]] = []
        """(start version, steps already in flight) for every step sent."""
        self.in_step: list[int] = []
        """Versions whose publish a step started itself."""
        self.refused: list[int] = []
        """Start versions of the steps refused."""
        self.hold_for_next: set[int] = set()
        """Start versions whose step trains only once the step after it was sent (tests
        that need a step sent ahead: without it the fake fails the step)."""
        self.no_publish_from: set[int] = set()
        """Start versions whose step does not start its publish (as the learner when a
        target does not answer): the job must publish it."""
        self.on_send: Callable[[int], None] | None = None
        """Called with each step's start version as it is sent."""
        self.pendings: list[FakePendingStep] = []
        self._failed_at: int | None = None
        self._step_lock = threading.Lock()

    def send_train_step(
        self, samples: list[TrainSample], start_version: int, publish_to: Sequence[str]
    ) -> FakePendingStep:
        pending = FakePendingStep()
        with self.cond:
            self.sent.append((start_version, self.in_flight))
            self.pendings.append(pending)
            self.in_flight += 1
            self.cond.notify_all()
        if self.on_send is not None:
            self.on_send(start_version)
        threading.Thread(
            target=self._run, args=(pending, samples, start_version, list(publish_to)), daemon=True
        ).start()
        return pending

    def _run(
        self, pending: FakePendingStep, samples: list[TrainSample], start: int, targets: list[str]
    ) -> None:
        try:
            with self.cond:
                ok = self.cond.wait_for(
                    lambda: self.version >= start or self._failed_at is not None,
                    self.WAIT_S,
                )
                if not ok or self.version != start or pending.cancelled:
                    self.refused.append(start)
                    raise StepRefused(f"step from v{start} refused (learner at v{self.version})")
            if start in self.hold_for_next:
                with self.cond:
                    sent_next = self.cond.wait_for(
                        lambda: any(v == start + 1 for v, _ in self.sent), self.WAIT_S
                    )
                assert sent_next, f"the step after the one from v{start} was not sent ahead"
            with self._step_lock:  # the step and its publish's start, as one command
                try:
                    result = self.train_step(samples)
                except BaseException:
                    with self.cond:
                        self._failed_at = self.version
                    raise
                if targets and start not in self.no_publish_from:
                    with self.cond:
                        assert self.cond.wait_for(lambda: self._started is None, self.WAIT_S)
                    self.start_publish(targets)
                    self.in_step.append(self.version)
                    result.publish_started = True
            pending.set(result)
        except BaseException as exc:  # noqa: BLE001 — the caller's result() raises it
            pending.set(None, exc)
        finally:
            with self.cond:
                self.in_flight -= 1
                self.cond.notify_all()

    def finish_publish(self) -> WeightUpdateReport:
        try:
            return super().finish_publish()
        finally:
            with self.cond:
                self.cond.notify_all()
