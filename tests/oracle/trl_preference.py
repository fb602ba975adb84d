"""Preference steps by TRL's ``DPOTrainer`` / ``KTOTrainer`` / ``ORPOTrainer`` and by
hybridflow's learner, on the same weights and the same tokenised examples.

TRL tokenises text; our pairs are token ids already. A ``DPOTrainer`` subclass replaces
``_prepare_dataset`` (TRL's tokenisation, and the EOS it appends to text) with the identity,
and nothing else: the collator, the log-probs, the loss, clipping and AdamW are TRL's. Both
sides take two steps on the same batch. The first has policy = reference (every margin 0,
loss log 2), so the second, with real margins, is where the losses can differ; the result
is read after it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from hybridflow.config.loader import with_keys
from hybridflow.data.preference import LabelledCompletion, PreferencePair
from hybridflow.preference.config import PreferenceConfig
from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.preference import preference_step
from hybridflow.services.learner.worker import LearnerWorker
from tests.oracle.trl_oracle import GradLog, StepResult, one_batch_args

with warnings.catch_warnings():
    # On import TRL warns that it supports vLLM up to 0.31 (unused here), vLLM that
    # torch.jit is deprecated; trl.experimental that it is experimental. Plain imports: TRL
    # is in the lock, so a broken install fails.
    warnings.simplefilter("ignore")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

STEPS = 2


def example_pairs(eos: int = 2) -> list[PreferencePair]:
    """6 prompts of 5 tokens; chosen of 2 to 5 tokens ended by ``eos``, rejected of 2 to 6."""
    pairs = []
    for g in range(6):
        prompt = [10 + (7 * g + k) % 50 for k in range(5)]
        chosen = [20 + (5 * g + k) % 40 for k in range(1 + g % 4)] + [eos]
        rejected = [30 + (3 * g + k) % 40 for k in range(2 + (g * 2) % 5)]
        pairs.append(PreferencePair(prompt, chosen, rejected, g))
    return pairs


def example_labelled(eos: int = 2) -> list[LabelledCompletion]:
    """8 prompts of 5 tokens with one completion each, 5 desirable and 3 not (KTO)."""
    rows = []
    for g in range(8):
        prompt = [10 + (7 * g + k) % 50 for k in range(5)]
        completion = [20 + (5 * g + k) % 40 for k in range(1 + g % 5)] + [eos]
        rows.append(LabelledCompletion(prompt, completion, label=g % 3 != 2, index=g))
    return rows


def trl_kto_steps(
    model_dir: Path, rows: list[LabelledCompletion], out_dir: Path, **config: Any
) -> StepResult:
    """``STEPS`` ``KTOTrainer`` steps on ``rows`` (one batch); ``config``: KTOConfig fields.

    The subclass skips TRL's tokenisation like ``trl_dpo_steps``. TRL's ``_prepare_dataset``
    also builds the mismatched pairs of the KL estimate (completions rotated by one within a
    batch: prompt i with completion i - 1); that one line is reproduced here."""

    class TokenisedKTO(KTOTrainer):  # type: ignore[misc]
        def _prepare_dataset(self, dataset: Any, *_: Any, **__: Any) -> Any:
            return dataset

    completions = [list(map(int, r.completion_ids)) for r in rows]
    data = Dataset.from_dict(
        {
            "prompt_ids": [list(map(int, r.prompt_ids)) for r in rows],
            "completion_ids": completions,
            "KL_completion_ids": [completions[-1], *completions[:-1]],
            "label": [bool(r.label) for r in rows],
        }
    )
    args = KTOConfig(**one_batch_args(out_dir, len(rows), STEPS), max_length=None, **config)
    return _train(TokenisedKTO, args, data, model_dir)


def trl_dpo_steps(
    model_dir: Path, pairs: list[PreferencePair], out_dir: Path, **config: Any
) -> StepResult:
    """``STEPS`` ``DPOTrainer`` steps on ``pairs`` (one batch); ``config``: DPOConfig fields."""

    class TokenisedDPO(DPOTrainer):  # type: ignore[misc]
        def _prepare_dataset(self, dataset: Any, *_: Any, **__: Any) -> Any:
            return dataset

    data = Dataset.from_dict(
        {
            "prompt_ids": [list(map(int, p.prompt_ids)) for p in pairs],
            "chosen_ids": [list(map(int, p.chosen_ids)) for p in pairs],
            "rejected_ids": [list(map(int, p.rejected_ids)) for p in pairs],
        }
    )
    args = DPOConfig(**one_batch_args(out_dir, len(pairs), STEPS), max_length=None, **config)
    return _train(TokenisedDPO, args, data, model_dir)


def trl_orpo_steps(
    model_dir: Path, pairs: list[PreferencePair], out_dir: Path, **config: Any
) -> StepResult:
    """``STEPS`` ``ORPOTrainer`` steps on ``pairs`` (one batch); ``config``: ORPOConfig fields.

    ORPO (in ``trl.experimental``) tokenises in ``tokenize_row``, mapped over the dataset in
    its ``__init__``; the subclass makes that the identity and the dataset carries the
    columns it would have built: ``{prompt, chosen, rejected}_input_ids`` and attention masks
    (chosen / rejected rows are the prompt followed by the completion) and
    ``{chosen, rejected}_labels`` (the row with the prompt masked by -100). The collator,
    the concatenated forward, the NLL (over prompt and chosen tokens), ``odds_ratio_loss``,
    clipping and AdamW are TRL's."""

    class TokenisedORPO(ORPOTrainer):  # type: ignore[misc]
        def tokenize_row(self, feature: Any, model: Any = None) -> Any:
            return feature

    columns: dict[str, list[list[int]]] = {}
    prompts = [list(map(int, p.prompt_ids)) for p in pairs]
    columns["prompt_input_ids"] = prompts
    columns["prompt_attention_mask"] = [[1] * len(p) for p in prompts]
    for name in ("chosen", "rejected"):
        rows = [p + list(map(int, getattr(r, f"{name}_ids"))) for p, r in zip(prompts, pairs)]
        columns[f"{name}_input_ids"] = rows
        columns[f"{name}_attention_mask"] = [[1] * len(r) for r in rows]
        columns[f"{name}_labels"] = [[-100] * len(p) + r[len(p) :] for p, r in zip(prompts, rows)]
    args = ORPOConfig(**one_batch_args(out_dir, len(pairs), STEPS), **config)
    return _train(TokenisedORPO, args, Dataset.from_dict(columns), model_dir)


def _train(trainer_class: type, args: Any, data: Any, model_dir: Path) -> StepResult:
    """Trains ``trainer_class`` on ``data`` from ``model_dir`` for its ``STEPS``; the last
    step's loss and gradients, and the weights."""
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        args=args,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    grads = GradLog()

    class GradRecorder(TrainerCallback):  # type: ignore[misc]
        def on_pre_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            grads.record(trainer.model)

    trainer.add_callback(GradRecorder())
    trainer.train()
    logged = trainer.state.log_history[STEPS - 1]
    params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    loss, grad_norm = float(logged["loss"]), float(logged["grad_norm"])
    return StepResult(loss, grad_norm, [], grads.steps, params)


def our_preference_steps(
    model_dir: Path,
    records: list[PreferencePair] | list[LabelledCompletion],
    preference: PreferenceConfig,
    **config: Any,
) -> StepResult:
    """``STEPS`` of our ``preference_step`` on ``records``; ``config``: LearnerConfig fields."""
    fields: dict[str, Any] = {
        "update": {"micro_batch_size": len(records)},
        "kl": {"use_reference": True},
        "seed": 0,
    }
    # ``config`` may use the flat names (``lr``): with_keys moves them as a job file's.
    worker = LearnerWorker(with_keys(with_keys(LearnerConfig(), fields), config), model_dir)
    grads = GradLog()
    worker.actor_optim.register_step_pre_hook(lambda *_: grads.record(worker.actor))
    for _ in range(STEPS):
        metrics = preference_step(worker, records, preference)
    params = {k: v.detach().clone() for k, v in worker.full_state_dict_items()}
    loss, grad_norm = metrics["train/loss"], metrics["actor/grad_norm"]
    return StepResult(loss, grad_norm, [], grads.steps, params)
