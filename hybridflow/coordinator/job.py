"""The training job: asynchronous PPO with a hard staleness bound (k = 0 is synchronous).

Rollout replicas generate continuously (one ``ReplicaDispatcher`` thread each) while the
trainer loop here takes batches from the ``GroupBuffer``, trains, and publishes weights.

Invariants (tested in tests/unit/coordinator/):
- Dynamic sampling (``dynamic_sampling.py``): groups with equal rewards are consumed without
  training, audited as ``"filtered"``, and replaced by new prompts.
- Nothing lost: every prompt of an epoch is handed out once (``PromptCursor``); a failed
  replica's prompts and stale groups are re-queued and generated again, and counted
  (``async/requeued``, ``async/dropped_stale``); what is still in flight or buffered when the
  run ends is reported in the summary.
- Staleness: no sample trains more than ``max_staleness`` versions behind the learner
  (admission control + oldest-first batches + a check at consumption), one bound in
  versions and steps (``staleness.StalenessBound``), fixed at the start from the learner's
  versions per step, which every step checks.
- ``max_staleness = 0`` with ``sync_every = 1`` is synchronous on-policy PPO on this path.
- Pause and stop take effect between steps (``JobControl``); a step is never half-done. A
  step already sent ahead (``ahead.py``: the next step goes to a learner service while the
  current one trains) trains and is logged first; nothing is sent ahead across a
  checkpoint, and a step sent ahead of a failed one is cancelled, never applied.
- Resumable: every ``checkpoint_every`` steps, on stop and at the end, the learner's train
  state and the schedule's state are saved together (``job_checkpoints.py``, over
  ``checkpoint.py`` and ``schedule_state.py``); ``resume=True`` continues from the newest one
  that verifies and fits (a refused one is logged, set aside, and the next older tried:
  docs/checkpoints.md) with every prompt of an epoch trained exactly once across the crash
  (what was pending is regenerated). Each checkpoint holds the resolved config it was taken
  with; a resume that changes a key it cannot honour is refused naming the key, before the
  learner loads anything (``resume_policy.py``, docs/resume.md), and a new
  ``prompts_per_step`` rebases the admission count. ``trained.jsonl`` is the audit: one line
  per trained group (step, epoch, prompt index, hand-out seq, policy version).
- A failed replica leaves the weight-sync set at once and rejoins (current weights first)
  when it is back (``publish.WeightPublisher``, which also owns the learner's lock and the
  background publish); with no replica serving, the job waits ``replica_rejoin_timeout_s``
  (shown in ``status``) instead of hanging. A replica that stops answering, or answers
  while its engine makes no progress on the request it holds, fails within
  ``replica_stall_timeout_s`` (``liveness.py``), so a hung one holds neither a batch nor a
  publish. Liveness probes never run inside the learner's critical section.

This module is the step loop (build, open, step, close, summarize), about 650 lines in one
class because every method reads or writes the loop's own state (buffer, dispatchers,
publisher, run records). Saving and restoring checkpoints is ``job_checkpoints.JobCheckpoints``,
handed the buffer, cursor and publisher the loop shares; the held-out evaluations' timing is
``eval_schedule.EvalSchedule``; when a step goes to the learner ahead is ``ahead.AheadRule``.
What needs none of the loop's state lives beside it (``buffer``, ``dispatch``, ``publish``,
``staleness``, ``schedule_state``, ``run_records``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hybridflow.coordinator.ahead import AheadRule, SentStep, ahead_learner, take_ahead
from hybridflow.coordinator.buffer import Admission, GroupBuffer
from hybridflow.coordinator.checkpoint import CheckpointStore, CoordinatorState
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.dataflow import Prompt, ScoredGroup, rollout_metrics, train_samples
from hybridflow.coordinator.dispatch import ReplicaDispatcher
from hybridflow.coordinator.dynamic_sampling import GroupFilter, dynamic_sampling_metrics
from hybridflow.coordinator.episode_sources import episode_runner
from hybridflow.coordinator.eval_schedule import EvalSchedule
from hybridflow.coordinator.evaluation import EvalSet
from hybridflow.coordinator.events import EventLog
from hybridflow.coordinator.job_checkpoints import JobCheckpoints
from hybridflow.coordinator.metrics import MetricsLog, Progress
from hybridflow.coordinator.pacing import Pacer
from hybridflow.coordinator.publish import WeightPublisher
from hybridflow.coordinator.run_records import (
    MFU_UNKNOWN,
    RunState,
    RunSummary,
    mean_finite,
    num_generated,
    step_timings,
    write_audit,
)
from hybridflow.coordinator.scaling import LIVE, ReplicaStatus, check_scale
from hybridflow.coordinator.services import Services
from hybridflow.coordinator.sinks import build_sinks
from hybridflow.coordinator.staleness import StalenessBound
from hybridflow.types import LearnerNeeds, SamplingParams
from hybridflow.utils.startup_marks import mark

log = logging.getLogger(__name__)
NO_NEEDS = LearnerNeeds()
"""A learner that needs nothing extra and adds one version per step (fakes, twins)."""


class TrainingJob:
    """The coordinator's schedule for one job: it owns the buffer, the replicas'
    dispatchers, the pacer and the step loop (admit, generate, score, train, publish,
    checkpoint), and writes the run's metrics, audit log and summary. It talks to the
    services only through ``Services`` (clients or in-process twins), so ``RLTrainer`` and
    ``deploy/launch.sh`` run the same code."""

    def __init__(
        self,
        config: CoordinatorConfig,
        services: Services,
        records: Sequence[Prompt],
        run_dir: Path,
        control: JobControl | None = None,
        resume: bool = False,
        checkpoint_root: Path | None = None,
        continue_from: CoordinatorState | None = None,
        needs: LearnerNeeds = NO_NEEDS,
        resolved_config: Mapping[str, Any] | None = None,
        eval_sets: Sequence[EvalSet] = (),
    ) -> None:
        """``checkpoint_root``: the learner's ``checkpoint_dir`` as this process sees it
        (deploy/launch.sh makes it <run dir>/checkpoints); None: no checkpoints at all.
        ``continue_from``: the state a previous job over the same services ended with (its
        ``state``), so steps, versions and counters continue; the replicas already have the
        learner's weights. ``RLTrainer`` runs one job per step this way.
        ``needs``: what the learner asked for (``LearnerClient.schedule_needs``): greedy
        baselines (every request also generates and scores one greedy response), routed
        experts (every request asks the rollout for them) and the versions per step, which
        fix the staleness bound in steps.
        ``resolved_config``: the job's whole resolved config as a dict (run.py: the
        ``JobConfig``), saved with each checkpoint and compared with it on resume
        (``resume_policy``); None: the coordinator section alone.
        ``eval_sets``: the held-out sets of ``coordinator.eval`` (``evaluation.py``)."""
        bound = StalenessBound(config.max_staleness, needs.versions_per_step)
        bound.check_sync_every(config.sync_every)
        if resume and checkpoint_root is None:
            raise ValueError("resume needs checkpoints (learner.checkpoint_dir is not set)")
        self.config = config
        self.resolved_config = (
            resolved_config if resolved_config is not None else {"coordinator": asdict(config)}
        )
        self.services = services
        self.num_rows = len(records)
        self.cursor = PromptCursor(records, config.seed)
        self.run_dir = run_dir
        self.resume = resume
        self.control = control or JobControl(config.num_steps, str(run_dir))
        self.params = _sampling_params(config, needs.routed_experts)
        # Admission lead (coordinator.admission: pace | greedy), fed after each step: pacing.py
        self.pacer = Pacer(bound.max_steps, config.sync_every, config.admission == "greedy")
        self.buffer = self._make_buffer(bound)
        self._stop = threading.Event()
        self.events = EventLog(run_dir / "events.jsonl")
        self.publisher = WeightPublisher(
            services,
            self.buffer,
            self.events,
            self._stop,
            config.service_wait_s,
            # Only when the next step may train before the publish ends (sync runs gain nothing).
            overlap=config.overlap_publish and bound.max_steps >= 1,
        )
        self.dispatchers = self._make_dispatchers(needs.greedy_baseline)
        self.publisher.dispatchers = self.dispatchers
        self.checkpoints = (
            JobCheckpoints(
                CheckpointStore(checkpoint_root, config.keep_checkpoints),
                services,
                self.publisher,
                self.buffer,
                self.cursor,
                self.events,
                run_dir,
                self.resolved_config,
                self.num_rows,
            )
            if checkpoint_root is not None
            else None
        )
        """Saves and restores this job's checkpoints; None: no checkpoints at all."""
        self.evaluations = (
            EvalSchedule(config, eval_sets, services, self.publisher, run_dir, self._stop)
            if config.eval.enabled
            else None
        )
        """Held-out evaluations (``coordinator.eval``); None when it lists no set."""
        self._ahead = ahead_learner(config, bound, services.learner)
        """The learner, when steps are sent ahead (``ahead.py``); None: one at a time."""
        self._ahead_rule = AheadRule(config, self.control, self.publisher, self._eval_due)
        self.state = self._initial_state(continue_from)
        self.last_metrics: dict[str, float] = {}
        """The metrics of the last trained step."""
        self._requeued_before = 0  # re-queues counted by the runs before a resume
        self._episodes: Any = None
        """The multi-turn episode runner every dispatcher uses (set by ``open``)."""
        self._scale_lock = threading.Lock()
        self.launch_time = time.time()
        """Where time_to_first_step_s counts from (run.py sets the launcher's start)."""

    def _make_buffer(self, bound: StalenessBound) -> GroupBuffer:
        """The buffer and its admission, under ``bound``; dynamic sampling filters groups."""
        cfg = self.config
        admission = Admission(
            cfg.prompts_per_step,
            bound,
            self.pacer.lead,
            max_groups=cfg.num_steps * cfg.prompts_per_step,
        )
        group_filter = (
            GroupFilter(cfg.prompts_per_step, cfg.dynamic_sampling_max_rounds)
            if cfg.dynamic_sampling
            else None
        )
        return GroupBuffer(admission, group_filter=group_filter)

    def _make_dispatchers(self, greedy_baseline: bool) -> list[ReplicaDispatcher]:
        """One dispatcher thread per rollout replica (not started yet)."""
        return [
            self._make_dispatcher(i, greedy_baseline) for i in range(len(self.services.rollouts))
        ]

    def _make_dispatcher(
        self, index: int, greedy_baseline: bool, joining: bool = False
    ) -> ReplicaDispatcher:
        """The dispatcher of ``services.rollouts[index]`` (not started yet); ``joining``: a
        replica added to the running job (``scale``)."""
        cfg, services = self.config, self.services
        per_request = cfg.prompts_per_request or max(
            1, cfg.prompts_per_step // len(services.rollouts)
        )
        return ReplicaDispatcher(
            index,
            services.rollouts[index],
            services.reward,
            services.decode,
            self.buffer,
            self.cursor,
            self.params,
            per_request,
            self._stop,
            self.events,
            rejoin=self.publisher.rejoin,
            rejoin_timeout_s=cfg.replica_rejoin_timeout_s,
            service_wait_s=cfg.service_wait_s,
            greedy_baseline=greedy_baseline,
            name=services.weight_targets[index],
            stall_timeout_s=cfg.replica_stall_timeout_s,
            request_size=None if cfg.prompts_per_request else self._request_size,
            overlap_scoring=cfg.overlap_scoring,
            joining=joining,
        )

    def _initial_state(self, continue_from: CoordinatorState | None) -> CoordinatorState:
        """A fresh job's state, or the previous job's (``continue_from``): then every step was
        trained and published and nothing is pending, so the buffer starts there."""
        versions_per_step = self.buffer.bound.versions_per_step
        if continue_from is None:
            return CoordinatorState(
                step=0,
                policy_version=0,
                versions_per_step=versions_per_step,
                cursor_epoch=0,
                cursor_position=0,
                pending=[],
                num_started=0,
                num_rows=self.num_rows,
            )
        step = continue_from.step
        self.buffer.restore([], step * self.config.prompts_per_step, step)
        for d in self.dispatchers:
            d.note_published(continue_from.policy_version)
        continue_from.versions_per_step = versions_per_step
        return continue_from

    # ------------------------------------------------------------------ replicas
    def scale(self, add: Sequence[str], remove: Sequence[str]) -> list[ReplicaStatus]:
        """Adds replicas at ``add`` (each joins: a dispatcher that serves once its catch-up
        sync passed its check) and drains those at ``remove`` (each serves its request in
        flight, then is removed); refused whole, before anything changes, when the request
        is wrong (``scaling.check_scale``). Returns the replicas as they are then. Runs on
        the control API's thread, beside the step loop."""
        with self._scale_lock:
            check_scale(add, remove, {d.address: d.state for d in self.dispatchers})
            connect = self.services.connect_rollout
            if add and connect is None:
                raise ValueError("scale: this job's services cannot reach a new replica")
            for address in add:
                assert connect is not None
                self.services.rollouts.append(connect(address))
                self.services.weight_targets.append(address)
                d = self._make_dispatcher(
                    len(self.dispatchers), self.dispatchers[0].greedy_baseline, joining=True
                )
                d.episodes = self._episodes
                self.dispatchers.append(d)
                d.start()
                log.info("scale: %s joins (catch-up sync, then it serves)", d.replica_name)
            for d in self.dispatchers:
                if d.address in remove and d.state in LIVE:
                    d.drain()
                    log.info("scale: %s drains (its request in flight ends first)", d.replica_name)
            self.buffer.wake_all()  # a drained dispatcher waiting for admission ends now
            self.events.record(
                "scale", time.time(), time.time(), add=list(add), remove=list(remove)
            )
        return self.replicas()

    def replicas(self) -> list[ReplicaStatus]:
        """Every replica the job has had, in the order they came, with its state."""
        return [
            ReplicaStatus(d.address, d.state, d.published_version) for d in list(self.dispatchers)
        ]

    def _request_size(self) -> int:
        """Default prompts per request: a step split among the replicas serving now (a
        replica that failed leaves the healthy ones whole steps, not half-size requests)."""
        serving = sum(1 for d in self.dispatchers if not d.failed)
        return max(1, self.config.prompts_per_step // max(1, serving))

    def _next_batch(self, version: int) -> list[ScoredGroup] | None:
        """Blocks for a batch; waits (bounded) while no replica serves; raises if the
        dispatchers can no longer make one."""
        cfg = self.config
        waiting_since: float | None = None
        while True:
            # First: a fatal error of one dispatcher stops the run even while the others
            # keep the buffer full.
            for d in self.dispatchers:
                if d.error is not None:
                    raise RuntimeError(f"dispatcher {d.index}: {d.error}") from d.error
            batch = self.buffer.take_batch(cfg.prompts_per_step, version, 0.5)
            if batch is not None:
                self.control.set_waiting("")
                return batch
            if all(not d.is_alive() for d in self.dispatchers):
                raise RuntimeError(
                    "every rollout replica failed and none came back within "
                    f"coordinator.replica_rejoin_timeout_s={cfg.replica_rejoin_timeout_s:g}"
                )
            if all(d.failed for d in self.dispatchers):
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    log.warning("no rollout replica serving: waiting for one to come back")
                self.control.set_waiting(
                    "a rollout replica to come back "
                    f"({time.monotonic() - waiting_since:.0f}s of "
                    f"{cfg.replica_rejoin_timeout_s:g}s)"
                )
            else:
                waiting_since = None
                self.control.set_waiting("")
            if self.control.stop_requested:
                return None

    # ------------------------------------------------------------------ checkpoints
    def _restore(self) -> None:
        """Continues from the newest checkpoint that verifies and fits, if any
        (``JobCheckpoints.restore``); its re-queue count carries on."""
        assert self.checkpoints is not None
        state = self.checkpoints.restore()
        if state is not None:
            self._requeued_before = state.num_requeued
            self.state = state

    def _checkpoint(self, step: int) -> str:
        """Saves step ``step`` (``JobCheckpoints.save``); "" when the job has none."""
        if self.checkpoints is None:
            return ""
        return self.checkpoints.save(step, self.state, self._num_requeued())

    # ------------------------------------------------------------------ run
    def run(self) -> RunSummary:
        """Trains steps until ``num_steps`` or a stop; checkpoints; returns the summary.
        With a learner that trains ahead, the next step is sent while the current one
        trains, when ``AheadRule`` allows it."""
        run = self.open()
        ahead: SentStep | None = None
        try:
            for step in range(run.first_step, self.config.num_steps + 1):
                sent = ahead or self._send(step, run)
                ahead = None
                if sent is None:
                    run.progress.message(f"stop requested: ending after step {step - 1}")
                    break
                if self._ahead is not None and self._ahead_rule.may_send_after(sent):
                    ahead = self._send_ahead(sent, run)
                self._land(sent, run)
            self.publisher.join()
            if self.evaluations is not None:
                self.evaluations.finish(
                    self.state.step, self.state.policy_version, run.metrics_log, run.progress
                )
            mark("coordinator", "last_step_done")
            self._finish(run)
            mark("coordinator", "final_checkpoint")
            self.control.finish()
        except Exception as exc:
            if ahead is not None:
                ahead.cancel()  # not trained unless the learner had begun it
            self.control.finish(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.close(run)
        return self._summarize(run)

    def open(self) -> RunState:
        """Restores (resume), opens the logs, brings fresh replicas up to date, starts the
        dispatchers. ``run`` is ``open``, ``step`` until ``num_steps`` or a stop, the final
        checkpoint, ``close`` and the summary; ``RLTrainer`` calls ``open``, one ``step`` and
        ``close`` for each of its steps (no checkpoints, no summary)."""
        if self.resume:
            self._restore()
        st = self.state
        run = RunState(
            first_step=st.step + 1,
            metrics_log=MetricsLog(
                self.run_dir / "metrics.jsonl", build_sinks(self.config.loggers, self.run_dir)
            ),
            audit=(self.run_dir / "trained.jsonl").open("a"),
            progress=Progress(self.config.num_steps, self.config.progress),
            start=time.perf_counter(),
            wall_before=st.wall_s,
            next_version=st.policy_version,
        )
        self.control.start()
        if st.step > 0:
            self.control.step_done(st.step, st.policy_version, {})
        if self.resume and st.step > 0:
            self.publisher.publish()  # fresh replicas get the restored weights before generating
        # After the resume checks: a refused resume must not need an environment.
        episodes = episode_runner(
            self.config.multi_turn, self.services, self.dispatchers[0].greedy_baseline
        )
        self._episodes = episodes
        for d in self.dispatchers:
            d.episodes = episodes
            d.start()
        self.control.attach_replicas(self.scale, self.replicas)
        if self.evaluations is not None:  # after the restore rewound its records
            self.evaluations.open(st.step, episodes)  # before training, or one a crash cut
        return run

    def step(self, step: int, run: RunState) -> bool:
        """Train step ``step`` of the open ``run``: batch → train → publish → pace → log →
        checkpoint. False: stopped before it trained."""
        sent = self._send(step, run)
        if sent is None:
            return False
        self._land(sent, run)
        return True

    def _send(self, step: int, run: RunState) -> SentStep | None:
        """Waits for step ``step``'s batch and hands it to the learner (None: stopped
        first); trained at once, unless the learner trains ahead."""
        if not self.control.wait_to_continue():
            return None
        t0 = time.perf_counter()
        batch = self._next_batch(run.next_version)
        if batch is None:
            return None
        return self._hand_over(step, batch, t0, run)

    def _send_ahead(self, current: SentStep, run: RunState) -> SentStep | None:
        """The step after ``current``, sent while it trains, if its batch is in the buffer
        before ``current`` ends (``ahead.take_ahead``); None otherwise."""
        t0 = time.perf_counter()
        batch = take_ahead(self.buffer, self.config.prompts_per_step, run.next_version, current)
        return None if batch is None else self._hand_over(current.step + 1, batch, t0, run)

    def _hand_over(self, step: int, batch: list[ScoredGroup], t0: float, run: RunState) -> SentStep:
        t1, w1 = time.perf_counter(), time.time()
        train_batch = train_samples(batch, first_group_id=step * self.config.prompts_per_step)
        sent = SentStep(step, batch, train_batch, t0, t1, w1)
        with self.publisher.learner_lock:  # the serving set read under it: see ``rejoin``
            if self._ahead is None:
                sent.result = self.services.learner.train_step(train_batch)
            else:
                if self._ahead_rule.publishes_in_step(step):
                    sent.serving = [d for d in self.dispatchers if not d.failed]
                targets = [self.services.weight_targets[d.index] for d in sent.serving]
                sent.pending = self._ahead.send_train_step(train_batch, run.next_version, targets)
        run.next_version += self.buffer.bound.versions_per_step
        return sent

    def _land(self, sent: SentStep, run: RunState) -> None:
        """Handles a sent step once the learner trained it: publish → pace → log →
        checkpoint. Its times count from the previous step's end (``run.landed_at``)."""
        cfg, st, step = self.config, self.state, sent.step
        result = sent.wait()
        t2, w2 = time.perf_counter(), time.time()
        t0 = max(sent.t0, run.landed_at)
        t1 = max(sent.t1, t0)
        train_batch, batch = sent.train_batch, sent.batch
        self.events.record("train", sent.w1, w2, step=step, num_samples=len(train_batch))
        self._check_versions(result.policy_version - st.policy_version)
        version = result.policy_version
        if sent.publishes and result.publish_started:
            self.publisher.started(step, version, sent.serving, w2)
        elif step % cfg.sync_every == 0:  # also when the learner could not start it
            # A failed replica leaves the set: the weight-sync group is re-planned.
            self.publisher.sync(step, version, w2)
        lead = self.buffer.pace(self.pacer, wait_s=t1 - t0)  # pacing.py
        t3 = run.landed_at = time.perf_counter()
        st.learner_busy_s += t3 - t1
        wall = run.wall_before + t3 - run.start
        gen_s = sum(d.busy_s for d in self.dispatchers)
        score_s = sum(d.score_s for d in self.dispatchers)
        metrics = {
            **rollout_metrics(batch),
            **result.metrics,
            **step_timings(train_batch, t0, t1, t2, t3, gen_s - run.gen_s_seen),
            "timing_s/score": score_s - run.score_s_seen,
            **self._schedule_metrics(lead, wall),
        }
        run.gen_s_seen, run.score_s_seen = gen_s, score_s
        write_audit(run.audit, step, batch, version)
        filtered = self.buffer.take_filtered()
        write_audit(run.audit, step, filtered, version, filtered=True)
        metrics.update(dynamic_sampling_metrics(self.buffer.group_filter, batch, filtered))
        metrics["batch/num_generated"] = float(num_generated([*batch, *filtered]))
        # The policy's reward: with dynamic sampling, over trained and filtered groups.
        st.rewards.append(
            metrics.get("dynamic_sampling/score_all_mean", metrics["critic/score/mean"])
        )
        st.num_samples += len(train_batch)
        st.step, st.policy_version, st.wall_s = step, version, wall
        run.metrics_log.write(step, metrics)
        for key, values in run.utilisation.items():
            if key in metrics:
                values.append(metrics[key])
        self.last_metrics = metrics
        if run.first_step_s is None:
            run.first_step_s = time.time() - self.launch_time
            mark("coordinator", "first_step_done")
            run.progress.first_step(run.first_step_s)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            run.last_checkpoint = self._checkpoint(step)
        self.control.step_done(step, version, metrics)
        run.progress.update(step, st.rewards[-1], f"v{version}")
        if self.evaluations is not None:
            self.evaluations.log_finished(run.metrics_log, run.progress)

    def _eval_due(self, step: int) -> bool:
        """An evaluation is due after step ``step`` (``AheadRule``)."""
        cfg = self.config
        return self.evaluations is not None and cfg.eval.due(step, cfg.num_steps)

    def _check_versions(self, added: int) -> None:
        """The learner's step added the versions its info said (the staleness bound's unit);
        a learner that says otherwise would let samples lag past the bound unnoticed."""
        expected = self.buffer.bound.versions_per_step
        if added != expected:
            raise RuntimeError(
                f"the learner's train step added {added} policy versions, its info said "
                f"{expected} per step (versions_per_step): the staleness bound would be wrong"
            )

    def _schedule_metrics(self, lead: int, wall: float) -> dict[str, float]:
        """The async schedule's counters after a step."""
        stats = self.buffer.stats
        return {
            "async/dropped_stale": float(stats.dropped_stale),
            "async/requeued": float(self._num_requeued()),
            "async/buffered": float(len(self.buffer)),
            "async/lead_steps": float(lead),
            "async/rollout_idle_ratio": self._rollout_idle_ratio(),
            "async/learner_idle_ratio": 1.0 - self.state.learner_busy_s / wall,
            "training/epoch": float(self.cursor.state.epoch),
            **(
                {  # since this coordinator started (restarts before a resume are not kept)
                    "episode/restarted": float(
                        sum(d.num_episodes_restarted for d in self.dispatchers)
                    )
                }
                if self.config.multi_turn.enabled
                else {}
            ),
        }

    def _num_requeued(self) -> int:
        return self._requeued_before + sum(d.num_requeued for d in self.dispatchers)

    def _rollout_idle_ratio(self) -> float:
        return sum(d.idle_ratio() for d in self.dispatchers) / len(self.dispatchers)

    def _finish(self, run: RunState) -> None:
        """A resumable checkpoint of the last step (on stop and at the end) and the final
        Hugging Face export."""
        st = self.state
        if st.step > 0:
            run.last_checkpoint = self._checkpoint(st.step)
        if self.config.save_checkpoint and st.step >= run.first_step and self.checkpoints:
            run.checkpoint = self.checkpoints.export_hf(st.step)

    def close(self, run: RunState) -> None:
        """Stops the dispatchers, waits for the publish in flight (a failed one is not
        retried any more) and closes the logs (also after a failure)."""
        self._stop.set()
        try:
            self.publisher.join()
        except RuntimeError as exc:
            log.warning("%s", exc)
        if self.evaluations is not None:
            self.evaluations.close()
        self.buffer.wake_all()
        for d in self.dispatchers:
            d.join(timeout=60)
        run.metrics_log.close()
        run.audit.close()
        self.events.close()
        run.wall_end = run.wall_before + time.perf_counter() - run.start

    def _summarize(self, run: RunState) -> RunSummary:
        """summary.json: rewards, throughput, what is left untrained, the checkpoints."""
        st, wall = self.state, run.wall_end
        leftover, requeued = self.buffer.drain()
        tail = st.rewards[-20:]
        group_filter = self.buffer.group_filter
        mfu = mean_finite(run.utilisation["perf/mfu"])
        summary = RunSummary(
            num_steps=len(st.rewards),
            reward_start=st.rewards[0] if st.rewards else 0.0,
            reward_end=sum(tail) / len(tail) if tail else 0.0,
            wall_s=wall,
            samples_per_s=st.num_samples / wall if wall else 0.0,
            policy_version=st.policy_version,
            num_requeued=self._num_requeued(),
            num_dropped_stale=self.buffer.stats.dropped_stale,
            num_untrained_at_end=len(leftover) + len(requeued),
            staleness_histogram={str(k): v for k, v in sorted(self.buffer.stats.staleness.items())},
            rollout_idle_ratio=self._rollout_idle_ratio(),
            learner_idle_ratio=1.0 - st.learner_busy_s / wall if wall else 0.0,
            checkpoint=run.checkpoint,
            resumed_from_step=run.first_step - 1,
            last_checkpoint=run.last_checkpoint,
            time_to_first_step_s=run.first_step_s,
            num_filtered=group_filter.num_filtered if group_filter else 0,
            mfu=mfu,
            tokens_per_s_per_device=mean_finite(run.utilisation["perf/tokens_per_s_per_device"]),
            mfu_note="" if mfu is not None else MFU_UNKNOWN,
            coordinator_cpu_s=_own_cpu_s(),
        )
        (self.run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
        return summary


def _sampling_params(config: CoordinatorConfig, routed_experts: bool) -> SamplingParams:
    """The sampling of every rollout request: ``coordinator.sampling``, one group each."""
    return SamplingParams(
        temperature=config.sampling.temperature,
        top_p=config.sampling.top_p,
        top_k=config.sampling.top_k,
        max_new_tokens=config.sampling.max_new_tokens,
        n=config.group_size,
        seed=config.seed,
        return_routed_experts=routed_experts,
    )


def _own_cpu_s() -> float:
    """This process's CPU seconds so far (user + system)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
