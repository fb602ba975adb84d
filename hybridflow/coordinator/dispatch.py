"""Keeps one rollout replica busy: admit prompts, generate, score, hand groups to the buffer.

One thread per replica. A replica whose call fails (``ServiceError``: unreachable, shedding
load, dead engine) has its in-flight prompts re-queued for the others and is taken out of the
rotation (``failed``); with a ``rejoin`` callback it keeps probing, and once the replica is
back (the launcher restarts it on its port) and has the current weights, it serves again; one
that is back but whose rejoin sync did not take effect (``DeliveryFailed``) stops the run, as a
failed delivery of any publish does. Bad input (a ValueError, ``BadRequest`` from a gRPC
client) and anything unexpected are fatal and reported to the trainer loop through ``error``,
never a silent thread death; a reward service that is ``Unavailable`` is retried for
``service_wait_s`` (it may be restarting) before that is fatal too. Transport-free: the
clients raise ``hybridflow.errors`` classes.

Each request carries a seed derived from the job seed and its first hand-out, so the same
prompts under the same weights sample the same completions (a resumed run repeats the
uninterrupted one). When the learner's estimator needs greedy baselines (ReMax), each request
also generates one greedy response per prompt on the same replica, scored in the same reward
call; either generate call failing fails the request.

Scoring overlaps generation (``overlap_scoring``): a request's groups are scored on the
dispatcher's scoring lane (one thread) while the replica generates the next request, at
most one request scoring while one generates, so a slow scorer (programs run in a sandbox)
costs the step its excess over generation, not its whole time. The lane hands groups to the
buffer in the order they were generated; a scoring failure re-queues that request's prompts
and, at the next hand-off, the prompts generated meanwhile, then ends the dispatcher as a
failure in its own thread does.

Replicas added to a running job (``hybridflow-coordinator scale``) start ``joining``: out of
the rotation, their dispatcher waits for them as for a failed one, and they serve once
``rejoin`` gave them the current weights (a catch-up sync through a weight-sync group of
their own, checked like every sync). A replica being removed is ``draining``: its dispatcher
admits nothing more, its request in flight ends as usual (its groups reach the buffer, or a
failure re-queues its prompts), and then it is ``removed`` for good.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from hybridflow.arrays import TokenArray
from hybridflow.clients import RewardClient, RolloutClient
from hybridflow.coordinator.buffer import GroupBuffer
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.dataflow import Prompt, attach_scores, score_items
from hybridflow.coordinator.episodes import EnvironmentDown, EpisodeBatch, EpisodeSource
from hybridflow.coordinator.events import EventLog
from hybridflow.coordinator.liveness import Reading, ReplicaStalled, StallWatch, probe_timing
from hybridflow.errors import DeliveryFailed, ResourceExhausted, ServiceError, Unavailable
from hybridflow.types import Completion, SamplingParams, ScoreResult

log = logging.getLogger(__name__)


class ReplicaDispatcher(threading.Thread):
    """The thread that keeps one rollout replica busy (module docstring): it owns that
    replica's in-flight requests and liveness; groups go to the shared ``GroupBuffer``, errors
    to the trainer loop through ``error``."""

    def __init__(
        self,
        index: int,
        rollout: RolloutClient,
        reward: RewardClient,
        decode: Callable[[TokenArray], str],
        buffer: GroupBuffer,
        cursor: PromptCursor[Any],
        params: SamplingParams,
        prompts_per_request: int,
        stop: threading.Event,
        events: EventLog | None = None,
        rejoin: Callable[[int, float], int | None] | None = None,
        rejoin_timeout_s: float = 0.0,
        service_wait_s: float = 0.0,
        greedy_baseline: bool = False,
        name: str = "",
        stall_timeout_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        probe_interval_s: float | None = None,
        rejoin_interval_s: float = 2.0,
        request_size: Callable[[], int] | None = None,
        episodes: EpisodeSource | None = None,
        overlap_scoring: bool = False,
        joining: bool = False,
    ) -> None:
        """``rejoin(index, timeout_s)``: the weights version replica ``index`` holds once it
        is healthy again and has the current weights, None while it is not back (waiting
        at most ``timeout_s``); probed every ``rejoin_interval_s`` for ``rejoin_timeout_s``
        after a failure. ``greedy_baseline``: each request also generates one greedy
        response per prompt on this replica, scored with the group, as the groups'
        ``baseline`` (ReMax). ``name``: how logs name the replica (its address).
        ``stall_timeout_s``: a replica silent this long while it holds a request has
        failed (0: never probed); ``probe_interval_s`` defaults from it (``liveness.py``).
        ``clock`` times deadlines and silences (a fake in tests). ``request_size``: prompts
        per request now (None: always ``prompts_per_request``); the job's default splits a
        step among the replicas serving, so one left alone takes whole steps.
        ``episodes``: multi-turn rollouts (``coordinator.multi_turn``): each request runs
        its prompts' episodes on this replica and the environment's rewards are the scores
        (the reward service is not called). ``overlap_scoring``: score each request on the
        scoring lane while the next one generates (module docstring). ``joining``: a replica
        added to the running job, out of the rotation until ``rejoin`` gave it the current
        weights."""
        super().__init__(name=f"dispatch-{index}", daemon=True)
        self.index = index
        self.replica_name = f"replica {index}" + (f" ({name})" if name else "")
        self.address = name
        """The replica's address (agent episodes generate on it from the environment
        service)."""
        self.rollout = rollout
        self.reward = reward
        self.decode = decode
        self.buffer = buffer
        self.cursor = cursor
        self.params = params
        self.prompts_per_request = prompts_per_request
        self.request_size = request_size
        self._job_stop = stop
        self._drain = threading.Event()
        self.stop_event = _AnyEvent(stop, self._drain)
        """Set when the job stops or this replica is drained: nothing more is admitted."""
        self.events = events or EventLog(None)
        self.rejoin = rejoin
        self.rejoin_timeout_s = rejoin_timeout_s
        self.service_wait_s = service_wait_s
        self.greedy_baseline = greedy_baseline
        self.stall_timeout_s = stall_timeout_s
        interval, self.probe_timeout_s = probe_timing(stall_timeout_s)
        self.probe_interval_s = interval if probe_interval_s is None else probe_interval_s
        self.rejoin_interval_s = rejoin_interval_s
        self.clock = clock
        self.num_rejoined = 0
        self.num_stalled = 0
        """Requests abandoned because the replica stopped answering."""
        self._state_lock = threading.Lock()
        self._failed = joining
        self._joining = joining
        self._removed = False
        self._published_version = 0
        self.busy_s = 0.0
        """Seconds spent generating (greedy baselines included)."""
        self.score_s = 0.0
        """Seconds spent in reward calls (on the scoring lane when it overlaps)."""
        self._lane = (
            _ScoringLane(self._score_and_put, f"score-{index}") if overlap_scoring else None
        )
        self.num_requeued = 0
        self.episodes = episodes
        self.num_episodes_restarted = 0
        """Episodes restarted from their task because the environment service was down."""
        self._env_down_since: float | None = None
        self.error: BaseException | None = None
        self.started_at = time.perf_counter()

    # ------------------------------------------------------------------ serving state
    @property
    def failed(self) -> bool:
        """Out of the rotation and the weight-sync set until it rejoins."""
        with self._state_lock:
            return self._failed

    @property
    def published_version(self) -> int:
        """Version the job last published to this replica: a reply generated under an older
        one means the replica restarted and lost its weights."""
        with self._state_lock:
            return self._published_version

    @property
    def state(self) -> str:
        """``joining`` (added, waiting for its catch-up sync), ``serving``, ``failed``
        (waiting to come back), ``draining``, ``removed``, ``stopped`` (the job ended), or
        ``lost`` (its dispatcher ended otherwise: not back within ``rejoin_timeout_s``, or a
        fatal error)."""
        with self._state_lock:
            if self._removed:
                return "removed"
            if self._drain.is_set():
                return "draining"
            if self.ident is not None and not self.is_alive():
                return "stopped" if self._job_stop.is_set() else "lost"
            if self._failed:
                return "joining" if self._joining else "failed"
            return "serving"

    def drain(self) -> None:
        """Takes the replica out for good: nothing more is admitted, the request in flight
        ends as usual, then the state is ``removed``."""
        self._drain.set()

    def mark_failed(self) -> bool:
        """Takes the replica out (its dispatcher then waits for it to rejoin); False if it
        already was."""
        with self._state_lock:
            was_serving, self._failed = not self._failed, True
        return was_serving

    def note_published(self, version: int) -> None:
        """A publish to the serving set reached this replica; ignored once it has failed
        (it is refitted when it rejoins)."""
        with self._state_lock:
            if not self._failed:
                self._published_version = version

    def rejoined(self, version: int) -> None:
        """Back in the serving set, holding ``version``. The publisher calls it under the
        learner's lock, right after the catch-up sync, so that no publish names the serving
        set without this replica (the learner would close the group it just formed); the
        dispatcher calls it again after, a no-op then."""
        with self._state_lock:
            if self._failed:
                self._failed, self._joining, self._published_version = False, False, version

    # ------------------------------------------------------------------ serving
    def _admit(self) -> list[Prompt]:
        """Blocks until the buffer's capacity rule lets some prompts start ([] once stopped)."""
        return self.buffer.admit(
            self.index, self._request_size, self.cursor.take_handouts, self.stop_event
        )

    def _request_size(self) -> int:
        return self.request_size() if self.request_size else self.prompts_per_request

    def run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # noqa: BLE001 — reported to the trainer loop
            log.exception("dispatcher %d stopped", self.index)
            self.error = exc

    def _serve(self) -> None:
        try:
            self._serve_requests()
        finally:
            try:
                if self._lane is not None:
                    self._lane.drain()  # its request's groups reach the buffer, or are re-queued
            finally:
                if self._drain.is_set():
                    with self._state_lock:
                        self._failed = self._removed = True
                    log.info("%s drained and removed", self.replica_name)

    def _serve_requests(self) -> None:
        request = 0
        while not self.stop_event.is_set():
            if self.failed and not self._wait_for_rejoin():
                return  # marked lost (e.g. by a failed weight publish) and not back
            prompts = self._admit()
            if not prompts:
                return
            request += 1
            params = self.params
            if params.seed is not None:
                first = int(getattr(prompts[0], "seq", 0))
                params = replace(params, seed=(params.seed * 1_000_003 + first) % 2**31)
            wall_start = time.time()
            start = time.perf_counter()
            expected_version = self.published_version
            try:
                groups, greedy, episodes = self._request(
                    prompts, params, f"r{self.index}-{request}"
                )
            except EnvironmentDown as exc:
                self.buffer.requeue(prompts)
                self.num_requeued += len(prompts)
                self.num_episodes_restarted += len(prompts) * params.n
                self._wait_for_environment(exc)
                continue
            except ServiceError as exc:
                self.mark_failed()  # first: the prompts' next taker sees it out of the set
                log.warning(
                    "%s failed (%s); its %d prompts are re-queued",
                    self.replica_name,
                    exc,
                    len(prompts),
                )
                self.buffer.requeue(prompts)
                self.num_requeued += len(prompts)
                continue  # the loop waits for it to come back
            except Exception:
                self.buffer.requeue(prompts)  # bad input: fatal, and nothing lost
                self.num_requeued += len(prompts)
                raise
            generated = [*groups, *(greedy or ())]
            got = min((c.policy_version for g in generated for c in g), default=expected_version)
            if got < expected_version:
                log.warning(
                    "replica %d answered under weights v%d, older than the v%d it was sent "
                    "(it restarted): it rejoins with the current weights",
                    self.index,
                    got,
                    expected_version,
                )
                self.mark_failed()
                self.buffer.requeue(prompts)
                self.num_requeued += len(prompts)
                continue
            self.busy_s += time.perf_counter() - start
            gen_end = time.time()
            self.events.record(
                "generate",
                wall_start,
                gen_end,
                replica=self.index,
                num_prompts=len(prompts),
                num_tokens=sum(len(c.token_ids) for g in generated for c in g),
                policy_version=groups[0][0].policy_version if groups else -1,
            )
            self._env_down_since = None
            if episodes is not None:  # the environment scored them
                self.buffer.put(episodes.scored(prompts))
                continue
            if self._lane is None:
                self._score_and_put(prompts, groups, greedy)
                continue
            try:
                self._lane.hand(prompts, groups, greedy)
            except Exception:
                self.buffer.requeue(prompts)  # the lane failed earlier: fatal, nothing lost
                self.num_requeued += len(prompts)
                raise

    def _score_and_put(
        self,
        prompts: list[Prompt],
        groups: list[list[Completion]],
        greedy: list[list[Completion]] | None,
    ) -> None:
        """Scores one request's groups and hands them to the buffer; on failure its prompts
        are re-queued (nothing lost) and the error raised."""
        wall_start, start = time.time(), time.perf_counter()
        try:
            results = self._score(score_items(prompts, groups, self.decode, greedy))
        except Exception:
            self.buffer.requeue(prompts)  # fatal (run() reports it); nothing lost
            self.num_requeued += len(prompts)
            raise
        finally:
            self.score_s += time.perf_counter() - start
        self.events.record(
            "score", wall_start, time.time(), replica=self.index, num_items=len(results)
        )
        self.buffer.put(attach_scores(prompts, groups, results, greedy is not None))

    def _request(
        self, prompts: list[Prompt], params: SamplingParams, request_id: str
    ) -> tuple[list[list[Completion]], list[list[Completion]] | None, EpisodeBatch | None]:
        """One request's generation, watched for a stall: its groups, their greedy baselines
        (ReMax) and, for multi-turn episodes, the episodes (scored by their environment)."""
        if self.episodes is None:
            groups, greedy = self._watched(partial(self._generate, prompts, params, request_id))
            return groups, greedy, None
        episodes = self._watched(partial(self._run_episodes, prompts, params, request_id))
        return episodes.groups, None, episodes

    def _run_episodes(
        self, prompts: list[Prompt], params: SamplingParams, request_id: str
    ) -> EpisodeBatch:
        assert self.episodes is not None
        return self.episodes.run(prompts, params, self.rollout.generate, request_id, self.address)

    def _wait_for_environment(self, exc: EnvironmentDown) -> None:
        """After the environment service failed a request: fatal once it has been down for
        ``service_wait_s`` (it is being restarted until then), else a pause before retrying."""
        now = time.monotonic()
        if self._env_down_since is None:
            self._env_down_since = now
        if now - self._env_down_since > self.service_wait_s:
            raise exc
        log.warning("%s; the request's episodes restart from their tasks", exc)
        self.stop_event.wait(1.0)

    def _watched(self, work: Callable[[], Any]) -> Any:
        """``work`` (the request's generation) on a helper thread while this one probes the replica;
        ``ReplicaStalled`` once it has shown no sign of life (``liveness.py``: no answer, or
        answers while its engine makes no progress on a request it holds) for
        ``stall_timeout_s``. The abandoned call ends on its own (its deadline, or the
        replica waking), and its result is dropped: its prompts are re-queued by the
        caller, so each is trained once."""
        if self.stall_timeout_s <= 0:
            return work()
        call = _Call(work, f"{self.name}-call")
        watch = StallWatch(self.stall_timeout_s, self.clock())
        while not call.done.wait(self.probe_interval_s):
            answered, reading = self._probe()
            if answered:
                watch.answered(self.clock(), reading)
            else:
                watch.unanswered()
            if watch.stalled(self.clock()) and not call.done.is_set():
                self.num_stalled += 1
                raise ReplicaStalled(
                    f"{watch.verdict(self.clock())} "
                    f"(coordinator.replica_stall_timeout_s={self.stall_timeout_s:g})"
                )
        return call.result()

    def _probe(self) -> tuple[bool, Reading | None]:
        """(whether the replica answered a status call within the probe's deadline, what
        it said of its engine's progress). Shedding it (``ResourceExhausted``: at its
        concurrency limit) is busy, not gone: an answer without a reading."""
        try:
            status = self.rollout.status(timeout_s=self.probe_timeout_s)
        except ResourceExhausted:
            return True, None
        except ServiceError:
            return False, None
        return True, Reading(status.engine_steps, status.num_active_requests > 0)

    def _generate(
        self, prompts: list[Prompt], params: SamplingParams, request_id: str
    ) -> tuple[list[list[Completion]], list[list[Completion]] | None]:
        """The request's groups, and with ``greedy_baseline`` one greedy completion per
        prompt (temperature 0, n 1, same max_new_tokens; top-p and top-k have no say under
        argmax, so 1 and 0) from the same replica; None without. Either call failing fails the
        request."""
        prompt_ids = [p.prompt_ids for p in prompts]
        groups = self.rollout.generate(prompt_ids, params, request_id)
        if not self.greedy_baseline:
            return groups, None
        greedy_params = replace(params, temperature=0.0, top_p=1.0, top_k=0, n=1)
        return groups, self.rollout.generate(prompt_ids, greedy_params, f"{request_id}-greedy")

    def _score(self, items: list[Any]) -> list[ScoreResult]:
        """Scores, retrying while the reward service is unreachable (being restarted) for
        up to ``service_wait_s``."""
        deadline = time.monotonic() + self.service_wait_s
        while True:
            try:
                return self.reward.score_batch(items)
            except Unavailable as exc:
                if time.monotonic() > deadline or self.stop_event.is_set():
                    raise
                log.warning("reward service unreachable (%s); retrying", exc)
                self.stop_event.wait(1.0)

    def _wait_for_rejoin(self) -> bool:
        """Probes until the replica is back with the current weights; False if it is not
        back within ``rejoin_timeout_s`` (or the job stops): it stays out of the rotation.
        No probe outlasts the deadline, so the verdict is logged when it passes. A replica
        that joins (``joining``) is tried at once, one that failed after a pause."""
        if self.rejoin is None or self.rejoin_timeout_s <= 0:
            return False
        deadline = self.clock() + self.rejoin_timeout_s
        pause = 0.0 if self._joining else self.rejoin_interval_s
        verb = "joined" if self._joining else "is back"
        while (left := deadline - self.clock()) > 0:
            if self.stop_event.wait(min(pause, left)):
                return False
            pause = self.rejoin_interval_s
            left = deadline - self.clock()
            if left <= 0:
                break
            try:
                version = self.rejoin(self.index, left)
            except DeliveryFailed as exc:  # back, but its weights did not take effect
                # As for any publish (publish.py): never serve on as if they had. The run
                # stops with the replica named; its prompts were re-queued when it failed.
                log.error(
                    "%s rejoined without its weights taking effect: %s", self.replica_name, exc
                )
                raise DeliveryFailed(f"{self.replica_name} rejoined, but {exc}") from exc
            except Exception as exc:  # noqa: BLE001 — not back yet; probe again
                log.info("%s not back yet: %s", self.replica_name, describe_error(exc))
                version = None
            if version is not None:
                log.info("%s %s with the current weights (v%d)", self.replica_name, verb, version)
                self.rejoined(version)
                self.num_rejoined += 1
                return True
        log.error("%s did not come back within %.0fs", self.replica_name, self.rejoin_timeout_s)
        return False

    def idle_ratio(self) -> float:
        wall = time.perf_counter() - self.started_at
        return max(0.0, 1.0 - self.busy_s / wall) if wall > 0 else 0.0


class _AnyEvent:
    """Set when any of its events is set (the job's stop, one replica's drain); waits poll
    at ``poll_s``, so a set event ends a wait within that."""

    poll_s = 0.1

    def __init__(self, *events: threading.Event) -> None:
        self._events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self._events)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = (
                self.poll_s if deadline is None else min(self.poll_s, deadline - time.monotonic())
            )
            if left <= 0:
                return False
            self._events[0].wait(left)
        return True


class _ScoringLane:
    """One thread that runs ``score_and_put`` for one request at a time, in the order the
    requests are handed to it; its failure is raised on the dispatcher's thread at the next
    ``hand`` or at ``drain``."""

    def __init__(self, score_and_put: Callable[..., None], name: str) -> None:
        self._score_and_put = score_and_put
        self._name = name
        self._call: _Call | None = None

    def hand(self, *request: Any) -> None:
        """Waits for the request before to be scored (raising its failure), then starts
        scoring this one."""
        self.drain()
        self._call = _Call(partial(self._score_and_put, *request), self._name)

    def drain(self) -> None:
        """Waits for the request being scored, if any; raises its failure."""
        call, self._call = self._call, None
        if call is not None:
            call.done.wait()
            call.result()


class _Call:
    """One call on a daemon thread: ``done`` is set when it returns or raises."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.done = threading.Event()
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # noqa: BLE001 — re-raised on the caller's thread
            self._error = exc
        finally:
            self.done.set()

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


def describe_error(exc: BaseException) -> str:
    """One line: the error's class and the first line of its message."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0]
