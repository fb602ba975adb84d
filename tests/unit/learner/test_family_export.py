"""The learner's Hugging Face export of every registered family, after a real training step,
loads with the family's own transformers class and decodes the learner's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from hybridflow.models.families import FAMILIES
from hybridflow.services.learner.worker import LearnerWorker
from tests.family_checkpoints import build_family_checkpoint
from tests.helpers import learner_config

CAUSAL_LM_CLASSES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
"""Each family's own class: the export must not need AutoModel's guess."""

PROMPTS = [[10, 11, 12, 13], [40, 41], [60, 61, 62, 63, 64, 65]]
NEW_TOKENS = 6


def greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_every_registered_family_has_its_class_here() -> None:
    assert sorted(CAUSAL_LM_CLASSES) == sorted(FAMILIES)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("model_type", sorted(CAUSAL_LM_CLASSES))
def test_export_loads_with_its_own_class_and_gives_the_learners_greedy_tokens(
    tmp_path: Path, model_type: str, tied: bool, make_samples
) -> None:
    source = build_family_checkpoint(tmp_path / "source", model_type, tied)
    config = learner_config(
        optimizer={"lr": 1e-2, "weight_decay": 0.0}, update={"micro_batch_size": 4}
    )
    worker = LearnerWorker(config, source)
    worker.train_step(make_samples([1.0, 0.0, 0.0, 1.0]))
    worker.save_checkpoint(tmp_path / "export")

    cls = getattr(transformers, CAUSAL_LM_CLASSES[model_type])
    exported = cls.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    assert exported.config.model_type == model_type
    assert exported.config.tie_word_embeddings == tied
    original = cls.from_pretrained(source, dtype=torch.float32).eval()
    learner = worker.actor.eval()
    trained = [greedy(learner, p) for p in PROMPTS]
    assert [greedy(exported, p) for p in PROMPTS] == trained
    # The export is the trained policy, not the checkpoint it started from.
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        got, before = exported(input_ids=ids).logits, original(input_ids=ids).logits
        torch.testing.assert_close(got, learner(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert (got - before).abs().max() > 1e-4
