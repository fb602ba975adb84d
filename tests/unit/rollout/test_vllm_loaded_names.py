"""A vLLM reload that leaves a parameter unloaded is caught (``vllm_worker._loaded_names``):
vLLM's own reload only logs the names its loaders skipped, so the replica would serve the old
tensor under the new version. The recorder reads what the model's ``load_weights`` returned
and restores the method afterwards."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from hybridflow.services.rollout.vllm_worker import _loaded_names


class Model(nn.Module):
    """A model whose loader, like vLLM's, skips names it does not know and reports the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 2)
        self.norm = nn.LayerNorm(2)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name in params:  # anything else is skipped without a word
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded


def test_the_names_a_reload_skipped_are_the_expected_minus_the_loaded() -> None:
    model = Model()
    weights = {n: torch.ones_like(p) for n, p in model.named_parameters()}
    weights["proj.wieght"] = weights.pop("proj.weight")  # a misspelt name vLLM would skip
    with _loaded_names(model) as loaded:
        model.load_weights(weights.items())
    assert loaded is not None
    assert loaded.expected - loaded.names == {"proj.weight"}
    assert "load_weights" not in vars(model)  # the class's method again


def test_a_whole_reload_leaves_nothing_unloaded() -> None:
    model = Model()
    with _loaded_names(model) as loaded:
        model.load_weights((n, torch.zeros_like(p)) for n, p in model.named_parameters())
    assert loaded is not None and loaded.expected == loaded.names


def test_a_reload_that_loaded_nothing_is_not_taken_for_one_that_reports_nothing() -> None:
    model = Model()
    with _loaded_names(model) as loaded:
        model.load_weights([("nothing.known", torch.zeros(1))])
    assert loaded is not None and loaded.reported and not loaded.names
