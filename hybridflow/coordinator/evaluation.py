"""Held-out evaluation while training (``coordinator.eval``): ``Evaluator`` and ``EvalHold``.

The rule that pins an evaluation to one policy version:
- An evaluation starts right after a weight publish lands on the replicas (or before the
  first step), and takes the ``EvalHold`` before that publish returns. While the hold is
  taken, the job's next weight publish waits (``WeightPublisher.sync``); training and
  admission go on (the dispatchers keep generating under the held version, within the
  staleness bound), so nothing drains. The hold ends when the evaluation is done, or at its
  deadline (``coordinator.eval.timeout_s``): then the evaluation is given up and reported,
  and the training goes on.
- Every sample must be generated whole by one version, the same for every sample of the
  evaluation: the first sample's version pins it. A sample whose tokens span versions
  (``token_versions``), or that came from another version (a replica that rejoined with newer
  weights), is refused: its prompt is asked again, on any replica, and counted in
  ``eval/<name>/redone``. ``eval/<name>/policy_version`` is the pinned version.
- Evaluation requests share the replicas with training's: each replica takes them in turn
  with the dispatchers' requests (no priority), ``prompts_per_request`` prompts at a time,
  one worker per replica.

Records: each set's complete result is one line of ``<run dir>/eval.jsonl`` (step, name,
version, metrics), written by the job as it logs the same metrics in metrics.jsonl and every
sink at the evaluation's step (after the step it finished in). A resume rewinds eval.jsonl to the restored step
(``job_checkpoints``); an evaluation due at that step with no line (a crash cut it) is run
again whole, one with its lines is not run twice.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hybridflow.arrays import TokenArray
from hybridflow.clients import RewardClient, RolloutClient
from hybridflow.coordinator.dataflow import Prompt, ScoredGroup, attach_scores, score_items
from hybridflow.coordinator.episodes import EpisodeSource
from hybridflow.coordinator.eval_config import EvalConfig
from hybridflow.coordinator.eval_metrics import set_metrics
from hybridflow.errors import ServiceError
from hybridflow.types import Completion, SamplingParams

log = logging.getLogger(__name__)
RECORDS = "eval.jsonl"
RETRY_S = 1.0
"""Pause of a worker after a failed request before it takes the next chunk."""


class EvalServices(Protocol):
    """What an evaluation calls: the replicas, the reward service and the decoder (the job's
    ``Services``; offline evaluation's own, without a learner)."""

    @property
    def rollouts(self) -> Sequence[RolloutClient]: ...

    @property
    def reward(self) -> RewardClient: ...

    @property
    def decode(self) -> Callable[[TokenArray], str]: ...

    @property
    def weight_targets(self) -> Sequence[str]:
        """Each replica's address (agent episodes generate on it by address)."""
        ...


class EvalHold:
    """Taken while an evaluation needs the replicas' weights to stay: ``wait`` returns once
    it is released or past its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self.num_waits = 0
        """Calls of ``wait`` that found it taken, in all."""

    def take(self, timeout_s: float) -> None:
        with self._cond:
            self._deadline = time.monotonic() + timeout_s

    def release(self) -> None:
        with self._cond:
            self._deadline = None
            self._cond.notify_all()

    @property
    def taken(self) -> bool:
        with self._cond:
            return self._deadline is not None and time.monotonic() < self._deadline

    def wait(self) -> float:
        """Blocks while the hold is taken (at most until its deadline); the seconds waited."""
        start = time.monotonic()
        with self._cond:
            if self._deadline is not None:
                self.num_waits += 1
            while self._deadline is not None:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        return time.monotonic() - start


@dataclass
class EvalSet:
    """One held-out set's prompts (loaded by the coordinator's main)."""

    name: str
    prompts: list[Prompt]


@dataclass
class EvalResult:
    """One set's evaluation at one step: its metrics, named ``eval/<name>/...``."""

    step: int
    name: str
    policy_version: int
    metrics: dict[str, float] = field(default_factory=dict)
    complete: bool = True
    """Every prompt was evaluated (False: the deadline came first; never recorded)."""

    def to_json(self) -> str:
        record = {"step": self.step, "name": self.name, "policy_version": self.policy_version}
        return json.dumps({**record, "metrics": self.metrics})


def read_records(path: Path) -> list[EvalResult]:
    """The results in an eval.jsonl (a line cut short by a crash is skipped)."""
    out: list[EvalResult] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            raw = json.loads(line)
            out.append(EvalResult(raw["step"], raw["name"], raw["policy_version"], raw["metrics"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


class _Pin:
    """The version an evaluation's samples must all come from (the first sample's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.version: int | None = None

    def check(self, completions: Sequence[Completion]) -> str:
        """``ok``: every completion was generated whole by the pinned version (pinning it to
        theirs when none is yet); ``spans``: one's tokens span versions (weights changed under
        it); ``other``: whole, but by another version (a replica that rejoined newer)."""
        versions = set()
        for c in completions:
            versions.add(c.policy_version)
            if c.token_versions is not None:
                versions.update(int(v) for v in c.token_versions if v >= 0)
        if len(versions) != 1:
            return "spans"
        (version,) = versions
        with self._lock:
            if self.version is None:
                self.version = version
            return "ok" if version == self.version else "other"


class Evaluator:
    """Runs the job's evaluations, one at a time, in a thread of their own (module
    docstring); the job takes their results (``take_results``) and logs them."""

    def __init__(
        self,
        config: EvalConfig,
        sets: Sequence[EvalSet],
        services: EvalServices,
        params: SamplingParams,
        run_dir: Path,
        stop: threading.Event,
        episodes: EpisodeSource | None = None,
    ) -> None:
        """``params``: the evaluation's sampling (``n`` = k); ``episodes``: the multi-turn
        runner when the job's rollouts are episodes."""
        self.config = config
        self.sets = list(sets)
        self.services = services
        self.params = params
        self.records_path = run_dir / RECORDS
        self.hold = EvalHold()
        self.episodes = episodes
        self._stop = stop
        self._thread: threading.Thread | None = None
        self._results: queue.Queue[EvalResult] = queue.Queue()
        self._done: set[tuple[int, str]] = set()
        self._requests = itertools.count(1)
        self.last_groups: dict[str, list[ScoredGroup]] = {}
        """Each set's scored groups of the latest evaluation (offline evaluation writes them)."""

    def load_records(self) -> None:
        """The results eval.jsonl holds (a resumed run's, after the restore rewound it)."""
        self._done = {(r.step, r.name) for r in read_records(self.records_path)}

    def done(self, step: int) -> bool:
        """Whether every set has a result for ``step`` (a resumed run's earlier one)."""
        return all((step, s.name) in self._done for s in self.sets)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, step: int) -> bool:
        """Evaluates the policy the replicas now hold, labelled ``step``, unless it was
        (every set's line is in eval.jsonl) or one is still running; takes the hold first,
        so the job's next publish waits for it. False: not started."""
        if self.done(step) or self.running:
            return False
        self.hold.take(self.config.timeout_s)
        self._thread = threading.Thread(
            target=self._run, args=(step,), name=f"eval-step{step}", daemon=True
        )
        self._thread.start()
        return True

    def wait(self) -> None:
        """Waits for the evaluation in flight (bounded by its deadline)."""
        if self._thread is not None:
            self._thread.join(self.config.timeout_s + 5.0)

    def take_results(self) -> list[EvalResult]:
        """The results finished since the last call."""
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def _run(self, step: int) -> None:
        deadline = time.monotonic() + self.config.timeout_s
        pin = _Pin()
        try:
            for eval_set in self.sets:
                if (step, eval_set.name) in self._done:
                    continue
                start = time.monotonic()
                groups, redone, complete = self._evaluate(eval_set.prompts, pin, deadline)
                self.last_groups[eval_set.name] = groups
                prefix = f"eval/{eval_set.name}/"
                version = pin.version if pin.version is not None else -1
                metrics = {
                    f"{prefix}{key}": value
                    for key, value in set_metrics(
                        groups, self.config.pass_threshold, self.services.decode
                    ).items()
                }
                metrics[f"{prefix}policy_version"] = float(version)
                metrics[f"{prefix}redone"] = float(redone)
                metrics[f"{prefix}timed_out"] = 0.0 if complete else 1.0
                metrics[f"{prefix}seconds"] = time.monotonic() - start
                result = EvalResult(step, eval_set.name, version, metrics, complete)
                if not complete:
                    log.warning(
                        "evaluation of %s at step %d not done within coordinator.eval."
                        "timeout_s=%g (%d of %d prompts); training goes on",
                        eval_set.name,
                        step,
                        self.config.timeout_s,
                        len(groups),
                        len(eval_set.prompts),
                    )
                self._results.put(result)
                if not complete:
                    break
        except Exception:  # noqa: BLE001 — an evaluation must not end the training
            log.exception("evaluation at step %d failed; training goes on", step)
        finally:
            self.hold.release()

    def record(self, result: EvalResult) -> None:
        """Appends a complete result to eval.jsonl (the job does, as it logs it: one writer
        for both records, so a result is in both or, cut by a crash, in neither)."""
        if not result.complete:
            return
        with self.records_path.open("a") as f:
            f.write(result.to_json() + "\n")
            f.flush()
        self._done.add((result.step, result.name))

    def _evaluate(
        self, prompts: Sequence[Prompt], pin: _Pin, deadline: float
    ) -> tuple[list[ScoredGroup], int, bool]:
        """The set's scored groups (in prompt order), the prompts asked again, and whether
        every prompt was done before the deadline."""
        size = self.config.prompts_per_request
        todo: queue.Queue[list[int]] = queue.Queue()
        for i in range(0, len(prompts), size):
            todo.put(list(range(i, min(i + size, len(prompts)))))
        done: dict[int, ScoredGroup] = {}
        lock = threading.Lock()
        redone = [0]

        def work(replica: int) -> None:
            while time.monotonic() < deadline and not self._stop.is_set():
                with lock:
                    if len(done) == len(prompts):
                        return
                try:
                    chunk = todo.get(timeout=0.1)
                except queue.Empty:
                    continue
                try:
                    scored = self._request([prompts[i] for i in chunk], replica)
                except ServiceError as exc:
                    log.warning("evaluation request on replica %d failed (%s)", replica, exc)
                    todo.put(chunk)
                    self._stop.wait(RETRY_S)
                    continue
                again, other = [], False
                for i, group in zip(chunk, scored, strict=True):
                    verdict = pin.check(group.completions)
                    if verdict == "ok":
                        with lock:
                            done[i] = group
                    else:
                        again.append(i)
                        other = other or verdict == "other"
                if again:
                    with lock:
                        redone[0] += len(again)
                    todo.put(again)
                if other:  # its replica holds another version, and keeps it while held
                    log.info("evaluation: replica %d holds another version; left out", replica)
                    return

        # Daemon workers: one stuck in a hung request is left to its call's deadline, and
        # the evaluation ends at its own.
        workers = [
            threading.Thread(target=work, args=(i,), name=f"eval-r{i}", daemon=True)
            for i in range(len(self.services.rollouts))
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        with lock:
            groups = [done[i] for i in sorted(done)]
        return groups, redone[0], len(groups) == len(prompts)

    def _request(self, prompts: list[Prompt], replica: int) -> list[ScoredGroup]:
        """One request's scored groups on ``replica``: episodes scored by their environment,
        or completions scored by the reward service."""
        request_id = f"eval-{next(self._requests)}"
        rollout = self.services.rollouts[replica]
        if self.episodes is not None:
            address = self.services.weight_targets[replica]  # agents generate on it by address
            batch = self.episodes.run(prompts, self.params, rollout.generate, request_id, address)
            return batch.scored(prompts)
        groups = rollout.generate([p.prompt_ids for p in prompts], self.params, request_id)
        results = self.services.reward.score_batch(
            score_items(prompts, groups, self.services.decode)
        )
        return attach_scores(prompts, groups, results)


def eval_params(config: EvalConfig, max_new_tokens: int, seed: int) -> SamplingParams:
    """The evaluation's sampling: ``coordinator.eval.sampling`` (greedy by default), k
    completions per prompt, the training's response limit unless it sets one."""
    sampling = config.sampling
    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_new_tokens=sampling.max_new_tokens or max_new_tokens,
        n=config.k,
        seed=seed,
    )
