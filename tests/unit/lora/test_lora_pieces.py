"""The LoRA pieces on their own: the config's refusals, the adapter table a model's linear
layers give, the merge, the exports (a PEFT directory peft itself loads, the merged model),
and a replica's two ways of applying adapters giving the learner's outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.lora.apply import AdapterTarget
from hybridflow.lora.config import LoraConfig
from hybridflow.lora.export import merged_items, write_peft_dir
from hybridflow.lora.names import adapter_table, merged, pairs
from hybridflow.lora.peft_layers import AdapterParams, adapters_off, base_table, inject
from tests.helpers import learner_config

IDS = torch.tensor([[3, 9, 14, 22, 5, 31, 8]])


def trained_lora_model(path: Path, rank: int = 4) -> torch.nn.Module:
    """The tiny model with adapters whose B is not zero (as after training)."""
    torch.manual_seed(0)
    model = inject(AutoModelForCausalLM.from_pretrained(path), LoraConfig(rank=rank))
    with torch.no_grad():
        for _, p in AdapterParams(model).named_parameters():
            p.normal_(0, 0.05)
    return model.eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_config_refuses_dropout_and_dotted_targets() -> None:
    LoraConfig(rank=8).validate()
    with pytest.raises(ValueError, match="learner.lora.dropout must be 0"):
        LoraConfig(rank=8, dropout=0.1).validate()
    with pytest.raises(ValueError, match="last names of linear layers"):
        LoraConfig(rank=8, target_modules=["self_attn.q_proj"]).validate()
    with pytest.raises(ValueError, match="rank"):
        LoraConfig(rank=-1).validate()


def test_a_critic_with_lora_is_refused_naming_the_way_out() -> None:
    cfg = learner_config(algorithm="ppo", lora={"rank": 8})
    with pytest.raises(ValueError, match="critic .* is not adapted yet"):
        cfg.validate()


def test_the_adapter_table_follows_the_targets() -> None:
    base = [
        ("model.layers.0.self_attn.q_proj.weight", (64, 32), "float32"),
        ("model.layers.0.self_attn.q_proj.bias", (64,), "float32"),
        ("model.layers.0.mlp.down_proj.weight", (32, 128), "float32"),
        ("model.norm.weight", (32,), "float32"),
    ]
    assert adapter_table(base, ["q_proj"], 8) == [
        ("model.layers.0.self_attn.q_proj.lora_A.weight", (8, 32), "float32"),
        ("model.layers.0.self_attn.q_proj.lora_B.weight", (64, 8), "float32"),
    ]
    with pytest.raises(ValueError, match="names no linear layer"):
        adapter_table(base, ["c_attn"], 8)
    with pytest.raises(ValueError, match="has \\['A'\\]"):
        pairs([("model.layers.0.self_attn.q_proj.lora_A.weight", torch.zeros(8, 32))])


def test_the_table_of_an_injected_model_is_the_one_replicas_derive(tiny_model_path) -> None:
    model = trained_lora_model(tiny_model_path, rank=4)
    live = [
        (n, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for n, p in AdapterParams(model).named_parameters()
    ]
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    rows = sorted((n, tuple(p.shape), "float32") for n, p in plain.named_parameters())
    assert (
        live
        == adapter_table(rows, LoraConfig().target_modules, 4)
        == adapter_table(base_table(model), LoraConfig().target_modules, 4)
    )
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, p in model.named_parameters() if ".lora_" in n
    }


def test_adapters_off_is_the_base_and_a_fresh_adapter_changes_nothing(tiny_model_path) -> None:
    base = logits(AutoModelForCausalLM.from_pretrained(tiny_model_path))
    model = trained_lora_model(tiny_model_path)
    assert (logits(model) - base).abs().max() > 1e-3
    with adapters_off(model):
        assert torch.equal(logits(model), base)
    fresh = inject(AutoModelForCausalLM.from_pretrained(tiny_model_path), LoraConfig(rank=4))
    assert torch.equal(logits(fresh.eval()), base)  # B starts at zero


def test_the_exports_reproduce_the_adapted_model(tiny_model_path, tmp_path) -> None:
    from peft import PeftModel

    model = trained_lora_model(tiny_model_path)
    expected = logits(model)
    adapters = [(n, p.detach()) for n, p in AdapterParams(model).named_parameters()]
    write_peft_dir(tmp_path / "adapter", adapters, LoraConfig(rank=4), str(tiny_model_path))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    assert torch.allclose(logits(loaded), expected, atol=1e-5)

    state = dict(merged_items(model.state_dict().items(), LoraConfig(rank=4).scale))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert set(state) == set(plain.state_dict())
    plain.load_state_dict(state)
    assert torch.allclose(logits(plain.eval()), expected, atol=1e-5)


@pytest.mark.parametrize("mode", ["adapter", "merged"])
def test_a_replica_applies_the_adapters_either_way(tiny_model_path, mode) -> None:
    learner = trained_lora_model(tiny_model_path)
    adapters = [(n, p.detach().clone()) for n, p in AdapterParams(learner).named_parameters()]
    replica = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    target = AdapterTarget(replica, LoraConfig(rank=4), mode)
    target.apply(adapters)
    assert torch.allclose(logits(replica), logits(learner), atol=1e-5)
    target.apply(adapters)  # merged from the kept W0, not on top of the last merge
    assert torch.allclose(logits(replica), logits(learner), atol=1e-5)
    with pytest.raises(ValueError, match="missing"):
        target.apply(adapters[:-1])
    with pytest.raises(ValueError, match="shape"):
        target.apply([(n, t.T) if i == 0 else (n, t) for i, (n, t) in enumerate(adapters)])


def test_merged_is_w_plus_scaled_b_a() -> None:
    w, a, b = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    assert torch.allclose(merged(w, a, b, 0.5), w + 0.5 * b @ a)
