"""The HF engine prefills each prompt once for its ``n`` completions, then repeats the cache:
every completion's log-probs must still be the model's own, recomputed over the prompt and the
completion with nothing shared, for prompts of different lengths (left padding) and a group
size above one; and the prefill must see one row per prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.services.rollout.config import RolloutConfig
from hybridflow.services.rollout.engines import build_engine
from hybridflow.types import SamplingParams

PROMPTS = ["12+7=", "3+4=", "101+250="]


def test_group_completions_carry_the_models_own_logprobs(tiny_model_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    prompts = [np.asarray(tok.encode(p, add_special_tokens=False)) for p in PROMPTS]
    engine = build_engine(RolloutConfig(engine="hf", seed=0), tiny_model_path)
    rows_seen: list[int] = []
    embeddings = engine.model.get_input_embeddings()
    embeddings.register_forward_hook(lambda _m, args, _o: rows_seen.append(args[0].shape[0]))
    params = SamplingParams(temperature=1.5, max_new_tokens=6, n=4, seed=3)
    groups = engine.generate(prompts, params)
    assert rows_seen[0] == len(PROMPTS)  # the prefill: one row per prompt
    assert all(rows == len(PROMPTS) * 4 for rows in rows_seen[1:])  # decode: every row
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    distinct = set()
    for prompt, group in zip(prompts, groups, strict=True):
        assert len(group) == 4
        for completion in group:
            tokens = np.asarray(completion.token_ids)
            assert tokens.size > 0
            distinct.add((prompt.tobytes(), tokens.tobytes()))
            ids = torch.from_numpy(np.concatenate([prompt, tokens])).long()[None]
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].double() / 1.5
            own = torch.log_softmax(logits, -1)[prompt.size - 1 : -1]
            want = own.gather(1, torch.from_numpy(tokens).long()[:, None])[:, 0].numpy()
            np.testing.assert_allclose(completion.logprobs, want, atol=1e-4, rtol=0)
    # the completions of a group were drawn apart, not copied from one another
    assert len(distinct) > len(PROMPTS)
