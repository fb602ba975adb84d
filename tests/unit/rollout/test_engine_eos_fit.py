"""EOS in the HF engine, checked as a distribution: a fake model whose next-token logits are
fixed, with EOS likely, gives completion lengths that fit the geometric law the contract
implies (each step stops with probability ``p = p_T(EOS)``; EOS ends the completion and is
kept as its last token; ``max_new_tokens`` without EOS is "length"), over 5,000 seeded
completions: chi-square p > 1e-3. The same counts reject a stop one token late or an EOS
dropped from the returned tokens (p < 1e-6).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from hybridflow.models.tokenizer import build_char_tokenizer
from hybridflow.services.rollout.engine import HFEngine
from hybridflow.types import SamplingParams
from tests.goodness_of_fit import P_ACCEPT, P_REJECT, goodness_of_fit, intended

VOCAB = 101
EOS = 2
MAX_NEW = 4
NUM_COMPLETIONS = 5_000


def fixed_logits() -> np.ndarray:
    """EOS 0.6, token 10 0.2, token 11 0.15, the other 98 tokens 0.05 between them."""
    probs = np.full(VOCAB, 0.05 / (VOCAB - 3))
    probs[EOS], probs[10], probs[11] = 0.6, 0.2, 0.15
    return np.log(probs)


class FixedLM(torch.nn.Module):
    """Fake causal LM: the same next-token logits at every position, whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        self.config = LlamaConfig(vocab_size=VOCAB, hidden_size=8, num_attention_heads=2)
        self.embed = torch.nn.Embedding(VOCAB, 4)
        self.logits = torch.from_numpy(fixed_logits()).float()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> SimpleNamespace:
        num_logits = 1 if kwargs.get("logits_to_keep") == 1 else input_ids.shape[1]
        logits = self.logits.expand(input_ids.shape[0], num_logits, VOCAB)
        return SimpleNamespace(logits=logits, past_key_values=kwargs["past_key_values"])


def length_law(p_stop: float, shift: int = 0) -> torch.Tensor:
    """P(length k, "stop") for k = 1..MAX_NEW, then P(MAX_NEW, "length"); ``shift`` moves the
    stop ``shift`` tokens later (a near miss: a stop seen one step late)."""
    cells = [0.0] * (MAX_NEW + 1)
    for k in range(1, MAX_NEW + 1):
        if k - shift >= 1:
            cells[k - 1] = (1 - p_stop) ** (k - 1 - shift) * p_stop
    cells[MAX_NEW] = 1.0 - sum(cells[:MAX_NEW])
    return torch.tensor(cells, dtype=torch.float64)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_lengths_fit_the_geometric_stop_law(temperature: float) -> None:
    engine = HFEngine.from_loaded(FixedLM(), build_char_tokenizer(), seed=0)
    assert engine.eos_token_id == EOS
    params = SamplingParams(
        temperature=temperature, max_new_tokens=MAX_NEW, n=NUM_COMPLETIONS, seed=5
    )
    (group,) = engine.generate([[5, 6, 7]], params)
    p_stop = float(intended(fixed_logits(), temperature, 1.0)[EOS])
    cells = torch.zeros(MAX_NEW + 1, dtype=torch.float64)
    for c in group:
        ids = c.token_ids.tolist()
        assert EOS not in ids[:-1]
        if c.finish_reason == "stop":
            assert ids[-1] == EOS  # EOS is kept, with its tempered log-prob
            assert c.logprobs[-1] == pytest.approx(math.log(p_stop), abs=1e-5)
            cells[len(ids) - 1] += 1
        else:
            assert c.finish_reason == "length" and len(ids) == MAX_NEW
            cells[MAX_NEW] += 1
    fit = goodness_of_fit(cells, length_law(p_stop))
    assert fit.p_value > P_ACCEPT, fit
    late = goodness_of_fit(cells, length_law(p_stop, shift=1))
    assert late.p_value < P_REJECT, late
    # EOS dropped from the tokens: lengths one shorter (an empty completion for a first EOS).
    dropped = torch.cat([cells[1:MAX_NEW], torch.zeros(1), cells[MAX_NEW:]])
    assert goodness_of_fit(dropped, length_law(p_stop)).p_value < P_REJECT
