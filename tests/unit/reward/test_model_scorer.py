"""The reward-model scorer on ``builtin:tiny-rm``: right sums above wrong answers, batching
invariance, max_length refusal and truncation, per-item failures, logit selection."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hybridflow.data.arith import arith_prompt, heldout_problems
from hybridflow.services.reward.config import RewardComponent
from hybridflow.services.reward.item_error import ItemError
from hybridflow.services.reward.model_scorer import ModelScorer
from hybridflow.types import ScoreItem

PROBLEMS = sorted(heldout_problems())[::4]
"""Five held-out problems: tiny-rm never saw them in training."""


def rm(path: Path, **kwargs: object) -> ModelScorer:
    return ModelScorer(RewardComponent(name="rm", kind="model", model=str(path), **kwargs), "rm")


def item(a: int, b: int, response: str) -> ScoreItem:
    return ScoreItem("arith", response, None, arith_prompt(a, b))


def scores(scorer: ModelScorer, items: list[ScoreItem]) -> list[float]:
    out = scorer.score(items)
    assert not [o for o in out if isinstance(o, ItemError)], out
    return [float(o) for o in out]  # type: ignore[arg-type]


def test_right_sums_score_above_wrong_answers(tiny_rm_path: Path) -> None:
    scorer = rm(tiny_rm_path)
    right = scores(scorer, [item(a, b, str(a + b)) for a, b in PROBLEMS])
    near = scores(scorer, [item(a, b, str(a + b + 1)) for a, b in PROBLEMS])
    garbage = scores(scorer, [item(a, b, "x=") for a, b in PROBLEMS])
    mean = sum(right) / len(right)
    assert mean - sum(near) / len(near) > 2.0
    assert mean - sum(garbage) / len(garbage) > 2.0
    assert all(g < 0 for g in garbage)


def test_scores_do_not_depend_on_batching(tiny_rm_path: Path) -> None:
    items = [item(a, b, r) for a, b in PROBLEMS for r in (str(a + b), "1", "garbage!")]
    one = scores(rm(tiny_rm_path, batch_size=1), items)
    many = scores(rm(tiny_rm_path, batch_size=len(items)), items)
    four = scores(rm(tiny_rm_path, batch_size=4), items)
    assert max(abs(x - y) for x, y in zip(one, many)) < 1e-5
    assert max(abs(x - y) for x, y in zip(one, four)) < 1e-5


def test_too_long_items_are_refused_or_truncated_and_counted(tiny_rm_path: Path) -> None:
    items = [item(1, 2, "3"), item(1, 2, "3" * 20)]  # 5 and 24 characters (= tokens)
    refused = rm(tiny_rm_path, max_length=8).score(items)
    assert isinstance(refused[0], float)
    assert isinstance(refused[1], ItemError) and refused[1].kind == "too_long"
    assert "24 tokens, more than rm.max_length=8" in str(refused[1])
    scorer = rm(tiny_rm_path, max_length=8, truncate=True)
    cut = scorer.score(items)
    assert scorer.num_truncated == 1
    assert cut[1] == pytest.approx(scores(scorer, [ScoreItem("arith", "3" * 8, None, "")])[0])


def test_a_failing_batch_is_retried_item_by_item(tiny_rm_path: Path) -> None:
    scorer = rm(tiny_rm_path, batch_size=8)
    good = scores(scorer, [item(1, 2, "3"), item(2, 2, "4")])
    poison = len(item(5, 5, "poisonous").prompt + "poisonous")
    forward = scorer._forward

    def fails_on_poison(chunk: list[list[int]]) -> list[float]:
        if any(len(ids) == poison for ids in chunk):
            raise RuntimeError("CUDA out of memory (simulated)")
        return forward(chunk)

    scorer._forward = fails_on_poison  # type: ignore[method-assign]
    out = scorer.score([item(1, 2, "3"), item(5, 5, "poisonous"), item(2, 2, "4")])
    assert out[0] == pytest.approx(good[0], abs=1e-5) and out[2] == pytest.approx(good[1], abs=1e-5)
    assert isinstance(out[1], ItemError) and out[1].kind == "model_error"
    assert "RuntimeError: CUDA out of memory" in str(out[1])


def test_sigmoid_scale_and_shift(tiny_rm_path: Path) -> None:
    items = [item(1, 2, "3"), item(1, 2, "9")]
    raw = scores(rm(tiny_rm_path), items)
    shaped = scores(rm(tiny_rm_path, sigmoid=True, scale=2.0, shift=-1.0), items)
    for logit, score in zip(raw, shaped):
        assert score == pytest.approx(2.0 / (1.0 + math.exp(-logit)) - 1.0, abs=1e-6)


def test_multi_label_models_need_a_label_index(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from hybridflow.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        pad_token_id=tok.pad_token_id,
    )
    config.num_labels = 3
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"rm.label_index: .* has num_labels=3"):
        rm(tmp_path)
    with pytest.raises(ValueError, match=r"rm.label_index: 3 but .* num_labels=3"):
        rm(tmp_path, label_index=3)
    model = LlamaForSequenceClassification.from_pretrained(tmp_path).eval()
    ids = torch.tensor([tok.encode("1+2=3")])
    with torch.no_grad():
        expected = model(input_ids=ids).logits[0, 2].item()
    assert scores(rm(tmp_path, label_index=2), [item(1, 2, "3")])[0] == pytest.approx(expected)
