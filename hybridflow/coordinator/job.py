"""The training job: asynchronous PPO with a hard staleness bound (k = 0 is synchronous).

Rollout replicas generate continuously (one ``ReplicaDispatcher`` thread each) while the
trainer loop here takes batches from the ``GroupBuffer``, trains, and publishes weights.

Invariants (tested in tests/unit/coordinator/):
- Nothing lost: every prompt of an epoch is handed out once (``PromptCursor``); a failed
  replica's prompts and stale groups are re-queued and generated again, and counted
  (``async/requeued``, ``async/dropped_stale``); what is still in flight or buffered when the
  run ends is reported in the summary.
- Staleness: no sample trains more than ``max_staleness`` versions behind the learner
  (admission control + oldest-first batches + a check at consumption).
- ``max_staleness = 0`` with ``sync_every = 1`` is synchronous on-policy PPO on this path.
- Pause and stop take effect between steps (``JobControl``); a step is never half-done.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hybridflow.coordinator.buffer import Admission, GroupBuffer
from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.cursor import PromptCursor
from hybridflow.coordinator.dataflow import Prompt, rollout_metrics, train_samples
from hybridflow.coordinator.dispatch import ReplicaDispatcher
from hybridflow.coordinator.events import EventLog
from hybridflow.coordinator.metrics import MetricsLog, Progress
from hybridflow.coordinator.step import Services
from hybridflow.types import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    num_steps: int
    reward_start: float
    """Mean reward of the first batch (samples from the initial policy)."""
    reward_end: float
    """Mean reward of the last min(20, steps) batches."""
    wall_s: float
    samples_per_s: float
    policy_version: int
    num_requeued: int
    num_dropped_stale: int
    num_untrained_at_end: int
    """Groups generated (or re-queued) but not trained when the run ended."""
    staleness_histogram: dict[str, int]
    rollout_idle_ratio: float
    learner_idle_ratio: float
    checkpoint: str


class TrainingJob:
    def __init__(
        self,
        config: CoordinatorConfig,
        services: Services,
        records: Sequence[Prompt],
        run_dir: Path,
        control: JobControl | None = None,
    ) -> None:
        if config.sync_every - 1 > config.max_staleness:
            raise ValueError(
                f"coordinator.sync_every={config.sync_every} lets samples lag "
                f"{config.sync_every - 1} versions, over max_staleness={config.max_staleness}"
            )
        self.config = config
        self.services = services
        self.cursor = PromptCursor(records, config.seed)
        self.run_dir = run_dir
        self.control = control or JobControl(config.num_steps, str(run_dir))
        self.params = SamplingParams(
            temperature=config.sampling.temperature,
            top_p=config.sampling.top_p,
            max_new_tokens=config.sampling.max_new_tokens,
            n=config.group_size,
        )
        self.buffer = GroupBuffer(Admission(config.prompts_per_step, config.max_staleness))
        self._stop = threading.Event()
        self.events = EventLog(run_dir / "events.jsonl")
        per_request = config.prompts_per_request or max(
            1, config.prompts_per_step // len(services.rollouts)
        )
        self.dispatchers = [
            ReplicaDispatcher(
                i,
                r,
                services.reward,
                services.decode,
                self.buffer,
                self.cursor,
                self.params,
                per_request,
                self._stop,
                self.events,
            )
            for i, r in enumerate(services.rollouts)
        ]

    def _next_batch(self, version: int) -> list | None:
        """Blocks for a batch; raises if the dispatchers can no longer make one."""
        cfg = self.config
        while True:
            batch = self.buffer.take_batch(cfg.prompts_per_step, version, cfg.max_staleness, 0.5)
            if batch is not None:
                return batch
            for d in self.dispatchers:
                if d.error is not None:
                    raise RuntimeError(f"dispatcher {d.index}: {d.error}") from d.error
            if all(d.failed for d in self.dispatchers):
                raise RuntimeError("every rollout replica failed")
            if self.control.stop_requested:
                return None

    def run(self) -> RunSummary:
        cfg = self.config
        metrics_log = MetricsLog(self.run_dir / "metrics.jsonl")
        progress = Progress(cfg.num_steps, cfg.progress)
        rewards: list[float] = []
        samples = 0
        version = 0
        versions_per_step = 1
        learner_busy_s = 0.0
        gen_s_seen = 0.0
        start = time.perf_counter()
        self.control.start()
        for d in self.dispatchers:
            d.start()
        checkpoint = ""
        try:
            for step in range(1, cfg.num_steps + 1):
                if not self.control.wait_to_continue():
                    progress.message(f"stop requested: ending after step {step - 1}")
                    break
                t0 = time.perf_counter()
                batch = self._next_batch(version)
                if batch is None:
                    progress.message(f"stop requested: ending after step {step - 1}")
                    break
                t1 = time.perf_counter()
                w1 = time.time()
                train_batch = train_samples(batch, first_group_id=step * cfg.prompts_per_step)
                result = self.services.learner.train_step(train_batch)
                t2 = time.perf_counter()
                w2 = time.time()
                self.events.record("train", w1, w2, step=step, num_samples=len(train_batch))
                if step == 1:
                    versions_per_step = max(1, result.policy_version - version)
                    self.buffer.admission.max_staleness_steps = (
                        cfg.max_staleness // versions_per_step
                    )
                version = result.policy_version
                if step % cfg.sync_every == 0:
                    # A failed replica leaves the set: the weight-sync group is re-planned.
                    targets = [
                        t
                        for t, d in zip(self.services.weight_targets, self.dispatchers)
                        if not d.failed
                    ]
                    self.services.learner.publish_weights(targets)
                    self.buffer.publish(step)
                    self.events.record("sync", w2, time.time(), step=step, version=version)
                t3 = time.perf_counter()
                learner_busy_s += t3 - t1
                gen_s = sum(d.busy_s for d in self.dispatchers)
                wall = t3 - start
                stats = self.buffer.stats
                metrics = {
                    **rollout_metrics(batch),
                    **result.metrics,
                    "timing_s/gen": gen_s - gen_s_seen,
                    "timing_s/wait_batch": t1 - t0,
                    "timing_s/update_actor": t2 - t1,
                    "timing_s/update_weights": t3 - t2,
                    "timing_s/step": t3 - t0,
                    "perf/throughput": sum(
                        len(s.prompt_ids) + len(s.response_ids) for s in train_batch
                    )
                    / (t3 - t0),
                    "perf/samples_per_s": len(train_batch) / (t3 - t0),
                    "async/dropped_stale": float(stats.dropped_stale),
                    "async/requeued": float(sum(d.num_requeued for d in self.dispatchers)),
                    "async/buffered": float(len(self.buffer)),
                    "async/rollout_idle_ratio": sum(d.idle_ratio() for d in self.dispatchers)
                    / len(self.dispatchers),
                    "async/learner_idle_ratio": 1.0 - learner_busy_s / wall,
                    "training/epoch": float(self.cursor.state.epoch),
                }
                gen_s_seen = gen_s
                rewards.append(metrics["critic/score/mean"])
                samples += len(train_batch)
                metrics_log.write(step, metrics)
                self.control.step_done(step, version, metrics)
                progress.update(step, rewards[-1], f"v{version}")
            if cfg.save_checkpoint and rewards:
                # A name under the learner's checkpoint_dir (the run directory).
                checkpoint = self.services.learner.save_checkpoint("checkpoint")
            self.control.finish()
        except Exception as exc:
            self.control.finish(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._stop.set()
            self.buffer.wake_all()
            for d in self.dispatchers:
                d.join(timeout=60)
            metrics_log.close()
            self.events.close()
        wall = time.perf_counter() - start
        leftover, requeued = self.buffer.drain()
        tail = rewards[-20:]
        summary = RunSummary(
            num_steps=len(rewards),
            reward_start=rewards[0] if rewards else 0.0,
            reward_end=sum(tail) / len(tail) if tail else 0.0,
            wall_s=wall,
            samples_per_s=samples / wall if wall else 0.0,
            policy_version=version,
            num_requeued=sum(d.num_requeued for d in self.dispatchers),
            num_dropped_stale=self.buffer.stats.dropped_stale,
            num_untrained_at_end=len(leftover) + len(requeued),
            staleness_histogram={str(k): v for k, v in sorted(self.buffer.stats.staleness.items())},
            rollout_idle_ratio=sum(d.idle_ratio() for d in self.dispatchers)
            / len(self.dispatchers),
            learner_idle_ratio=1.0 - learner_busy_s / wall if wall else 0.0,
            checkpoint=checkpoint,
        )
        (self.run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
        return summary
