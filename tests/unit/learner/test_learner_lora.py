"""A LoRA learner (``learner.lora``): only the adapters train (the optimizer holds them
alone, the base never moves), the KL reference is the base model, a train state holds the
adapters and their AdamW state and resumes exactly, a checkpoint exports the merged model and
the PEFT adapter directory, and full-model and LoRA train states refuse each other."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.errors import CheckpointRejected
from hybridflow.services.learner.train_state import save_train_state
from hybridflow.services.learner.worker import LearnerWorker
from hybridflow.types import TrainSample
from tests.helpers import learner_config

IDS = torch.tensor([[3, 9, 14, 22, 5, 31, 8]])
LORA = {
    "lora": {"rank": 4, "alpha": 8.0},
    "optimizer": {"lr": 1e-2},
    "kl": {"use_reference": True, "coef": 0.05},
}


def samples(seed: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(6):
        response = torch.randint(4, 60, (3 + i % 3,), generator=g).tolist()
        out.append(
            TrainSample(
                torch.randint(4, 60, (4,), generator=g).tolist(),
                response,
                [-2.0] * len(response),
                float(i % 2),
                i // 3,
                0,
            )
        )
    return out


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_only_the_adapters_train_and_the_reference_is_the_base(tiny_model_path) -> None:
    worker = LearnerWorker(learner_config(LORA), tiny_model_path)
    adapters = dict(worker.adapters.named_parameters())
    in_optimizer = {id(p) for g in worker.actor_optim.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in adapters.values()}
    frozen = {
        n: p.detach().clone() for n, p in worker.actor.named_parameters() if not p.requires_grad
    }
    before = {n: p.detach().clone() for n, p in adapters.items()}
    base = logits(AutoModelForCausalLM.from_pretrained(tiny_model_path).eval())
    worker.train_step(samples(0))
    result = worker.train_step(samples(1))
    assert result.metrics["actor/kl_loss"] > 0
    assert all(torch.equal(p, frozen[n]) for n, p in worker.actor.named_parameters() if n in frozen)
    assert sum(not torch.equal(p, before[n]) for n, p in adapters.items()) == len(adapters)
    assert worker.reference is not None
    assert torch.equal(logits(worker.reference), base)  # no second copy: the base itself
    assert (logits(worker.actor) - base).abs().max() > 1e-3


def test_a_train_state_resumes_adapters_and_optimizer_exactly(tiny_model_path, tmp_path) -> None:
    config = learner_config(LORA)
    first = LearnerWorker(config, tiny_model_path)
    first.train_step(samples(0))
    save_train_state(first, tmp_path / "state")
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(tmp_path / "state" / "dcp")).read_metadata().state_dict_metadata
    weights = [k for k in keys if k.startswith("actor.model.")]
    assert len(weights) == len(dict(first.adapters.named_parameters()))  # no frozen base
    assert all(".lora_" in k for k in weights)
    continued = first.train_step(samples(1))

    resumed = LearnerWorker(config, tiny_model_path)
    assert resumed.load_train_state(tmp_path / "state") == 1
    again = resumed.train_step(samples(1))
    assert again.metrics == pytest.approx(continued.metrics, abs=1e-6)
    for (name, p), (_, q) in zip(
        first.adapters.named_parameters(), resumed.adapters.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)


def test_full_and_lora_train_states_do_not_fit_each_other(tiny_model_path, tmp_path) -> None:
    full = LearnerWorker(learner_config(optimizer={"lr": 1e-2}), tiny_model_path)
    save_train_state(full, tmp_path / "full")
    lora = LearnerWorker(learner_config(LORA), tiny_model_path)
    with pytest.raises(CheckpointRejected, match="lora_A"):
        lora.load_train_state(tmp_path / "full")
    save_train_state(lora, tmp_path / "lora")
    with pytest.raises(CheckpointRejected, match="does not fit"):
        full.load_train_state(tmp_path / "lora")


def test_the_export_is_the_merged_model_and_a_peft_adapter(tiny_model_path, tmp_path) -> None:
    from peft import PeftModel

    worker = LearnerWorker(learner_config(LORA), tiny_model_path)
    worker.train_step(samples(0))
    worker.save_checkpoint(tmp_path / "export")
    expected = logits(worker.actor)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    assert not any(".lora_" in n or "base_layer" in n for n in merged.state_dict())
    torch.testing.assert_close(logits(merged), expected, atol=1e-5, rtol=0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    adapted = PeftModel.from_pretrained(base, tmp_path / "export" / "adapter").eval()
    torch.testing.assert_close(logits(adapted), expected, atol=1e-5, rtol=0)
