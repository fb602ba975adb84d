"""AdamW's state laid out up front (``optim_layout.lay_out_adam_state``): the optimizer then
steps exactly as one whose state its first step created, bit for bit, and the worker's
optimizers hold their state before their first step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hybridflow.services.learner.optim_layout import lay_out_adam_state


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    model[1].bias.requires_grad_(False)  # a frozen parameter has no state either way
    return model


@pytest.mark.parametrize("amsgrad", [False, True])
def test_laid_out_adamw_steps_as_a_lazily_built_one(amsgrad: bool) -> None:
    lazy_model, laid_model = _model(), _model()
    kwargs = {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": amsgrad}
    lazy = torch.optim.AdamW([p for p in lazy_model.parameters() if p.requires_grad], **kwargs)
    laid = torch.optim.AdamW([p for p in laid_model.parameters() if p.requires_grad], **kwargs)
    lay_out_adam_state(laid)
    assert len(lazy.state) == 0 and len(laid.state) == 3
    for state in laid.state.values():
        assert float(state["step"]) == 0.0 and not state["exp_avg"].any()
    torch.manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, 6)
        for model, optim in ((lazy_model, lazy), (laid_model, laid)):
            optim.zero_grad(set_to_none=True)
            model(x).pow(2).sum().backward()
            optim.step()
    for a, b in zip(lazy_model.parameters(), laid_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    lazy_state, laid_state = lazy.state_dict()["state"], laid.state_dict()["state"]
    assert lazy_state.keys() == laid_state.keys()
    for key, state in lazy_state.items():
        assert state.keys() == laid_state[key].keys()
        for name, value in state.items():
            other = laid_state[key][name]
            assert value.dtype == other.dtype and value.device == other.device
            torch.testing.assert_close(value, other, rtol=0, atol=0)


def test_state_already_there_and_other_optimizers_are_left_alone() -> None:
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    lay_out_adam_state(sgd)
    assert len(sgd.state) == 0
    adam = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    first = next(iter(adam.param_groups[0]["params"]))
    kept = {"step": torch.tensor(7.0), "exp_avg": torch.ones_like(first),
            "exp_avg_sq": torch.ones_like(first)}  # fmt: skip
    adam.state[first] = kept
    lay_out_adam_state(adam)
    assert adam.state[first] is kept and float(adam.state[first]["step"]) == 7.0
