"""The HF engine's first generated token has the statistics of ``transformers`` ``generate``
(``do_sample``, the same temperature, top-k and top-p) on ``builtin:tiny``: 10,000 seeded
draws from each over one prompt, compared with a two-sample chi-square, and each against the
distribution the model's logits give.

``generate`` applies top-k 50 unless told otherwise (its ``GenerationConfig`` default), so the
comparison always passes our ``top_k`` (0: off). Its warpers run in our order (temperature,
``TopKLogitsWarper``, ``TopPLogitsWarper``). Its top-p (``TopPLogitsWarper``)
removes the tokens whose ascending cumulative mass is at most ``1 - top_p``, the same set as
ours in exact arithmetic; the settings keep every cumulative mass 1e-3 away from the boundary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.services.rollout.config import RolloutConfig
from hybridflow.services.rollout.engines import build_engine
from hybridflow.types import SamplingParams
from tests.goodness_of_fit import P_ACCEPT, counts_of, goodness_of_fit, intended, two_sample

NUM_DRAWS = 10_000
PROMPT = "12+7="


@pytest.fixture(scope="module")
def model_and_prompt(tiny_model_path: Path) -> tuple[torch.nn.Module, list[int]]:
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    return model, tok.encode(PROMPT, add_special_tokens=False)


# (2.0, 0.9, 7): the nucleus of the 7 most likely tokens, renormalised, keeps 6 of them; top-p
# before top-k would keep 7 (the full distribution's nucleus holds 8).
@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (1.5, 0.8, 0), (2.0, 0.9, 7)]
)
def test_first_token_matches_transformers_generate(
    tiny_model_path: Path,
    model_and_prompt: tuple[torch.nn.Module, list[int]],
    temperature: float,
    top_p: float,
    top_k: int,
) -> None:
    model, prompt = model_and_prompt
    vocab = model.config.vocab_size
    ids = torch.tensor([prompt] * NUM_DRAWS)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
            temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=1, pad_token_id=0,
        )  # fmt: skip
    theirs = counts_of(out[:, len(prompt)], vocab)
    engine = build_engine(RolloutConfig(engine="hf", seed=0), tiny_model_path)
    params = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=1, n=NUM_DRAWS, seed=1
    )
    ours = counts_of([int(c.token_ids[0]) for c in engine.generate([prompt], params)[0]], vocab)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double().numpy()
    exact = intended(logits, temperature, top_p, top_k=top_k)
    both, fit_ours, fit_theirs = two_sample(ours, theirs), goodness_of_fit(ours, exact), \
        goodness_of_fit(theirs, exact)  # fmt: skip
    assert both.p_value > P_ACCEPT, both
    assert fit_ours.p_value > P_ACCEPT, fit_ours
    assert fit_theirs.p_value > P_ACCEPT, fit_theirs
    assert int((exact > 0).sum()) >= 4  # enough tokens in play for the test to mean something
    print(f"T={temperature} top_p={top_p} top_k={top_k}: two-sample {both}; ours {fit_ours}; "
          f"generate {fit_theirs}; support {int(np.count_nonzero(exact))}")  # fmt: skip
