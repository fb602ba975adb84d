"""When a training job's held-out evaluations run, and where their results go.

``EvalSchedule`` ties the ``Evaluator`` (``evaluation.py``: what one evaluation does, pinned
to one policy version) to the step loop (``job.py``): it hooks the weight publisher, so a
publish that lands a due step (``coordinator.eval.every``, the last step) starts an
evaluation whose hold the next publish waits for; at open it evaluates the starting step
when due (before training, or the evaluation a crash cut); after each step it writes the
evaluations finished since at their own steps (metrics.jsonl and every sink, eval.jsonl);
after the last step it sends that step's weights if ``sync_every`` did not, and waits for
the evaluation in flight (bounded by its deadline).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.episodes import EpisodeSource
from hybridflow.coordinator.evaluation import EvalServices, EvalSet, Evaluator, eval_params
from hybridflow.coordinator.publish import WeightPublisher

log = logging.getLogger("coordinator")


class EvalSchedule:
    """The held-out evaluations of one training job (module docstring)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        sets: Sequence[EvalSet],
        services: EvalServices,
        publisher: WeightPublisher,
        run_dir: Path,
        stop: threading.Event,
    ) -> None:
        if not sets:
            raise ValueError("coordinator.eval lists sets, but none was loaded")
        self.config = config
        self.publisher = publisher
        params = eval_params(config.eval, config.sampling.max_new_tokens, config.seed)
        self.evaluator = Evaluator(config.eval, sets, services, params, run_dir, stop)
        publisher.hold = self.evaluator.hold
        publisher.on_published = self.on_published
        self._evaluated_through = 0
        """Publishes up to this step were looked at for a due evaluation."""

    def open(self, step: int, episodes: EpisodeSource | None) -> None:
        """The job starts (or resumes) at ``step``: the records the restore rewound are
        read, and ``step`` is evaluated when due and not already recorded."""
        self.evaluator.episodes = episodes
        self.evaluator.load_records()
        self._evaluated_through = step
        if self.config.eval.due(step, self.config.num_steps):
            self.evaluator.start(step)

    def on_published(self, step: int) -> None:
        """A publish of step ``step`` landed: evaluate it if a step since the last publish
        was due."""
        first, self._evaluated_through = (
            self._evaluated_through + 1,
            max(self._evaluated_through, step),
        )
        cfg = self.config
        if any(cfg.eval.due(s, cfg.num_steps) for s in range(first, step + 1)):
            self.evaluator.start(step)

    def log_finished(self, metrics_log: Any, progress: Any) -> None:
        """Writes the evaluations finished since the last call at their own steps, with a
        line each (on the progress bar, else the log)."""
        for result in self.evaluator.take_results():
            metrics_log.write(result.step, result.metrics)
            self.evaluator.record(result)
            headline = {k.rsplit("/", 1)[1]: v for k, v in result.metrics.items()}
            score = headline.get("pass@1", float("nan"))
            line = (
                f"eval {result.name} after step {result.step} (policy v{result.policy_version}): "
                f"pass@1 {score:.3f} over {int(headline.get('num_prompts', 0))} prompts"
                + (" (timed out)" if headline.get("timed_out") else "")
            )
            if self.config.progress:
                progress.message(line)
            else:
                log.info("%s", line)

    def finish(self, step: int, version: int, metrics_log: Any, progress: Any) -> None:
        """After the last step trained (``step``, policy ``version``): its weights reach the
        replicas unless ``sync_every`` sent them, and are evaluated when due; waits for the
        evaluation in flight and logs it."""
        if step == self.config.num_steps and self._evaluated_through < step:
            self.publisher.sync(step, version, time.time())
            self.publisher.join()
        self.evaluator.wait()
        self.log_finished(metrics_log, progress)

    def close(self) -> None:
        """Waits for the evaluation in flight (its workers see the job's stop)."""
        self.evaluator.wait()
