"""``PreferenceTrainer`` / ``train_offline``: offline DPO, KTO, ORPO or SFT on a ``LearnerWorker``.

The trainer reads a dataset once (``hybridflow.data.preference``), visits it in seeded epoch
order (``hybridflow.data.datasets.epoch_order``), and runs one ``preference_step`` per batch on
the learner worker (the RL learner's actor, optimizer and frozen reference; single process, or
every rank of a torchrun group calling the same methods). It evaluates on held-out *pairs*
whatever the loss, so DPO, KTO, ORPO and SFT are compared on the same numbers: preference accuracy
and reward margin (implicit reward ``beta * log(pi / pi_ref)``) and the chosen responses' NLL.
A built-in train set defaults to its ``builtin:arith_dpo:test`` pairs; a file has no default.

No rollout or reward service is involved; nothing here knows about gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hybridflow.config.loader import with_keys
from hybridflow.data.datasets import epoch_order
from hybridflow.data.preference import read_preference_dataset
from hybridflow.preference.config import PreferenceConfig
from hybridflow.services.learner.config import LearnerConfig, OptimizerConfig


@dataclass
class OfflineResult:
    """What ``train_offline`` returns."""

    history: list[dict[str, float]] = field(default_factory=list)
    """Train metrics of every step, in order."""
    evals: list[dict[str, float]] = field(default_factory=list)
    """Held-out metrics: before training, every ``eval_every`` steps and at the end (each
    carries ``step``)."""
    checkpoint: str | None = None
    """Where the trained actor was saved (``save_to``), else None."""


def default_eval_spec(data: str) -> str | None:
    """Held-out pairs for a built-in train set (``builtin:arith_<kind>`` -> its test pairs)."""
    if data.startswith("builtin:arith_") and not data.endswith(":test"):
        return "builtin:arith_dpo:test"
    return None


class PreferenceTrainer:
    """A learner worker plus a preference dataset; ``step`` trains one batch, ``evaluate``
    scores the held-out pairs."""

    def __init__(
        self,
        model: str | Path,
        data: str | Sequence[Any],
        loss: str = "dpo",
        batch_size: int = 16,
        beta: float = 0.1,
        label_smoothing: float = 0.0,
        dpo_loss_type: str = "sigmoid",
        orpo_lambda: float = 0.1,
        orpo_nll_prompt: bool = False,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        eval_data: str | Sequence[Any] | None = None,
        num_rows: int | None = None,
        seed: int = 0,
        learner: LearnerConfig | None = None,
        **learner_overrides: Any,
    ) -> None:
        """``model``: builtin:tiny or a local HF checkpoint dir. ``data``/``eval_data``: a spec
        (``builtin:arith_dpo``, a .jsonl/.parquet path) or already-read records; eval data is
        DPO pairs. ``learner`` (default: ``LearnerConfig`` with lr 1e-4 and ``seed``) is
        updated with ``learner_overrides`` as a job file's learner keys (``optimizer={"lr": 1e-3}``,
        ``topology={"device": "cuda"}``; the old flat names, ``lr=1e-3``, still work);
        the frozen reference is always loaded (the eval's implicit rewards need it; ORPO and SFT
        do not train against it)."""
        from hybridflow.services.learner.worker import LearnerWorker

        self.config = PreferenceConfig(
            loss=loss,  # type: ignore[arg-type]
            beta=beta,
            label_smoothing=label_smoothing,
            dpo_loss_type=dpo_loss_type,  # type: ignore[arg-type]
            orpo_lambda=orpo_lambda,
            orpo_nll_prompt=orpo_nll_prompt,
            desirable_weight=desirable_weight,
            undesirable_weight=undesirable_weight,
        )
        self.config.validate()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.seed = seed
        base = (
            learner
            if learner is not None
            else LearnerConfig(optimizer=OptimizerConfig(lr=1e-4), seed=seed)
        )
        learner_cfg = with_keys(base, learner_overrides)
        learner_cfg = replace(learner_cfg, kl=replace(learner_cfg.kl, use_reference=True))
        self.worker = LearnerWorker(learner_cfg, model)
        tokenizer = self.worker.tokenizer
        self.records = (
            read_preference_dataset(data, tokenizer, self.config.record_kind, num_rows, seed)
            if isinstance(data, str)
            else list(data)
        )
        if len(self.records) < batch_size:
            raise ValueError(f"data: {len(self.records)} rows cannot fill batch_size={batch_size}")
        if eval_data is None and isinstance(data, str):
            eval_data = default_eval_spec(data)
        self.eval_records = (
            read_preference_dataset(eval_data, tokenizer, "dpo", None, seed)
            if isinstance(eval_data, str)
            else (None if eval_data is None else list(eval_data))
        )
        self.num_steps = 0
        self._order: list[int] = []
        self._epoch = 0

    def next_batch(self) -> list[Any]:
        """The next ``batch_size`` records in seeded epoch order (an epoch's tail carries over)."""
        while len(self._order) < self.batch_size:
            self._order += epoch_order(len(self.records), self._epoch, self.seed)
            self._epoch += 1
        picked, self._order = self._order[: self.batch_size], self._order[self.batch_size :]
        return [self.records[i] for i in picked]

    def step(self, batch: Sequence[Any] | None = None) -> dict[str, float]:
        """One optimizer step on ``batch`` (default: the next one); train metrics."""
        metrics = self.worker.preference_step(
            list(batch) if batch is not None else self.next_batch(), self.config
        )
        self.num_steps += 1
        metrics["step"] = float(self.num_steps)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Held-out pair metrics (``eval/rewards/accuracies``, ``eval/rewards/margins``,
        ``eval/nll``, ...); ValueError without eval data."""
        from hybridflow.services.learner.preference import preference_eval

        if not self.eval_records:
            raise ValueError("no eval data: pass eval_data (DPO pairs)")
        metrics = preference_eval(self.worker, self.eval_records, self.config.beta)
        metrics["step"] = float(self.num_steps)
        return metrics

    def save(self, path: str | Path) -> str:
        """The actor as a Hugging Face checkpoint (rank 0 writes)."""
        self.worker.save_checkpoint(path)
        return str(path)


def train_offline(
    model: str | Path,
    data: str | Sequence[Any],
    loss: str = "dpo",
    steps: int = 100,
    eval_every: int = 0,
    save_to: str | Path | None = None,
    on_metrics: Callable[[str, dict[str, float]], None] | None = None,
    **trainer_args: Any,
) -> OfflineResult:
    """Trains ``steps`` batches of ``loss`` on ``data`` and evaluates held-out pairs before,
    every ``eval_every`` steps (0: only at the ends) and after. ``on_metrics(kind, metrics)``
    sees each as it comes (kind "train" or "eval"). ``trainer_args`` go to
    ``PreferenceTrainer`` (batch_size, beta, lr, eval_data, learner, ...)."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    trainer = PreferenceTrainer(model, data, loss=loss, **trainer_args)
    result = OfflineResult()
    has_eval = bool(trainer.eval_records)

    def record(kind: str, metrics: dict[str, float]) -> None:
        (result.evals if kind == "eval" else result.history).append(metrics)
        if on_metrics is not None:
            on_metrics(kind, metrics)

    if has_eval:
        record("eval", trainer.evaluate())
    for step in range(1, steps + 1):
        record("train", trainer.step())
        if has_eval and (step == steps or (eval_every and step % eval_every == 0)):
            record("eval", trainer.evaluate())
    if save_to is not None:
        result.checkpoint = trainer.save(save_to)
    return result
