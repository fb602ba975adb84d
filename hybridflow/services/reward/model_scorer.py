"""Reward-model scorer: a sequence-classification checkpoint scores prompt + response text.

``ModelScorer(component, key)`` loads ``AutoModelForSequenceClassification`` and its tokenizer
from ``component.model`` (``builtin:tiny-rm`` or a local directory) onto ``component.device``.
``score(items)`` tokenizes ``item.prompt + item.response`` (the tokenizer's own special tokens
added, no chat template), runs one forward pass per ``batch_size`` items (right-padded, with
attention mask, under ``torch.no_grad()``) and reads one logit per item: the only one when
``num_labels == 1``, else ``label_index`` (a multi-label model without ``label_index`` is
refused at load). The score is ``scale * logit + shift`` (``sigmoid(logit)`` first when set).
The logit is transformers' pooled one: that of each row's last token that is not the pad id
(so right padding never changes a score).

Failures stay per item: an item longer than ``max_length`` tokens is an error unless
``truncate`` (then it keeps its last ``max_length`` tokens and is counted); a batch whose
forward pass raises (CUDA out of memory, a bad input) is retried one item at a time, and only
the items that still fail get an error. One lock serialises the model between the service's
scoring threads. torch and transformers are imported only when a scorer is built.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hybridflow.services.reward.config import RewardComponent
from hybridflow.services.reward.item_error import ItemError
from hybridflow.types import ScoreItem

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ScoreOrError = float | ItemError
"""One item's outcome: a finite score or the reason it has none."""


class ModelScorer:
    """One reward model on its device; thread-safe."""

    def __init__(self, component: RewardComponent, key: str) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from hybridflow.models import resolve_model_path

        self.component = component
        self._key = key
        self._lock = threading.Lock()
        self._num_truncated = 0
        if component.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"{key}.device: {component.device!r} but CUDA is not available")
        path = resolve_model_path(component.model)
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=getattr(torch, component.dtype)
        )
        num_labels = int(model.config.num_labels)
        if component.label_index is None and num_labels != 1:
            raise ValueError(
                f"{key}.label_index: {component.model!r} has num_labels={num_labels}; "
                "set label_index to the logit that is the score"
            )
        self._label = component.label_index or 0
        if self._label >= num_labels:
            raise ValueError(
                f"{key}.label_index: {self._label} but {component.model!r} has "
                f"num_labels={num_labels}"
            )
        self._pad_id = self._resolve_pad_id(model)
        self._model = model.to(component.device).eval()

    def _resolve_pad_id(self, model: PreTrainedModel) -> int:
        """The padding id; the model must know it to find each row's last token."""
        pad_id = self._tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self._tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError(f"{self._key}.model: the tokenizer has neither a pad nor an EOS token")
        if model.config.pad_token_id is None:
            model.config.pad_token_id = pad_id
        return int(model.config.pad_token_id)

    @property
    def num_truncated(self) -> int:
        """Items cut to ``max_length`` so far (only with ``truncate``)."""
        with self._lock:
            return self._num_truncated

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreOrError]:
        """One outcome per item, in order."""
        with self._lock:
            encoded = [self._encode(item) for item in items]
            out: list[ScoreOrError] = [e if isinstance(e, ItemError) else math.nan for e in encoded]
            ready = [(i, e) for i, e in enumerate(encoded) if not isinstance(e, ItemError)]
            size = self.component.batch_size
            for start in range(0, len(ready), size):
                chunk = ready[start : start + size]
                results = self._score_chunk([ids for _, ids in chunk])
                for (i, _), result in zip(chunk, results):
                    out[i] = result
            return out

    def _encode(self, item: ScoreItem) -> list[int] | ItemError:
        try:
            ids = list(self._tokenizer(item.prompt + item.response)["input_ids"])
        except Exception as exc:  # a text the tokenizer rejects belongs to this item only
            return ItemError("scorer_exception", f"tokenizer raised {type(exc).__name__}: {exc}")
        limit = self.component.max_length
        if len(ids) > limit:
            if not self.component.truncate:
                return ItemError(
                    "too_long",
                    f"prompt + response is {len(ids)} tokens, more than {self._key}.max_length"
                    f"={limit} (set {self._key}.truncate to keep the last {limit})",
                )
            ids = ids[-limit:]
            self._num_truncated += 1
        if not ids:
            return ItemError("scorer_exception", "prompt + response encode to no tokens")
        return ids

    def _score_chunk(self, chunk: list[list[int]]) -> list[ScoreOrError]:
        """Scores of one forward pass; on failure, one pass per item."""
        try:
            return [self._finish(logit) for logit in self._forward(chunk)]
        except Exception as exc:
            self._release_cache()
            if len(chunk) == 1:
                return [ItemError("model_error", f"forward raised {type(exc).__name__}: {exc}")]
        return [r for ids in chunk for r in self._score_chunk([ids])]

    def _forward(self, chunk: list[list[int]]) -> list[float]:
        import torch

        width = max(len(ids) for ids in chunk)
        device = self.component.device
        input_ids = torch.tensor(
            [ids + [self._pad_id] * (width - len(ids)) for ids in chunk], device=device
        )
        mask = torch.tensor(
            [[1] * len(ids) + [0] * (width - len(ids)) for ids in chunk], device=device
        )
        with torch.no_grad():
            logits = self._model(input_ids=input_ids, attention_mask=mask).logits
        return [float(x) for x in logits[:, self._label].double().cpu().tolist()]

    def _finish(self, logit: float) -> ScoreOrError:
        value = 1.0 / (1.0 + math.exp(-logit)) if self.component.sigmoid else logit
        score = self.component.scale * value + self.component.shift
        if not math.isfinite(score):
            return ItemError("non_finite_score", f"model gave non-finite score {score}")
        return score

    def _release_cache(self) -> None:
        if self.component.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
