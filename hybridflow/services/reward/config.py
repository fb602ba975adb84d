"""Configuration of the reward service (imports without torch or grpc).

This module only describes and validates settings; it does not import user scorers (that
happens in ``hybridflow.services.reward.registry`` when the registry is built).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.ranges import at_least, raise_problems, within
from hybridflow.rpc.config import ServerConfig

GSM8K_METHODS = ("strict", "flexible")
COMPONENT_KINDS = ("rule", "model")
MODEL_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class RewardComponent:
    """One term of a combined reward: a rule scorer or a reward model, with a weight.

    An item's final score is the sum of ``weight * score`` over the components that apply to
    it; each component's own (unweighted) score is reported in ``ScoreResult.components``.
    """

    name: str = ""
    """Unique, non-empty; names the score in ``ScoreResult.components`` and the batch metric
    ``reward/<name>/mean``."""
    kind: Literal["rule", "model"] = "rule"
    """"rule": a registered scorer; "model": a sequence-classification checkpoint."""
    weight: float = 1.0
    """Multiplies this component's score in the sum (any finite number, 0 included)."""
    data_sources: list[str] = field(default_factory=list)
    """Applies only to items whose data_source equals or starts with one of these (as the
    registry matches); empty: applies to every item."""
    scorer: str | None = None
    """kind rule: a registered scorer name (built-in, verl alias or a ``reward.scorers`` key)
    that scores every item it applies to; None: the item's data_source picks, as without
    components."""
    model: str = ""
    """kind model: ``builtin:tiny-rm`` or a local checkpoint directory (required)."""
    device: str = "cpu"
    """kind model: torch device of the model ("cpu", "cuda", "cuda:1")."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """kind model: parameter dtype; scores are returned as float64 either way."""
    batch_size: int = 32
    """kind model: items per forward pass (right-padded, with attention mask)."""
    max_length: int = 512
    """kind model: most tokens of prompt + response an item may have."""
    truncate: bool = False
    """kind model: an item longer than max_length keeps its last max_length tokens (and is
    counted in the service's ``truncated`` counter) instead of getting an error."""
    label_index: int | None = None
    """kind model: which logit is the score. None requires a model with num_labels == 1
    (loading another is refused); an index picks that logit of a multi-label head."""
    sigmoid: bool = False
    """kind model: score = scale * sigmoid(logit) + shift instead of scale * logit + shift."""
    scale: float = 1.0
    """kind model: multiplies the (sigmoid of the) logit."""
    shift: float = 0.0
    """kind model: added after scaling."""

    def problems(self, key: str) -> list[str]:
        """Problem lines of this component, each naming ``key.<field>``."""
        found: list[str | None] = []
        if not isinstance(self.name, str) or not self.name.strip():
            found.append(f"{key}.name: must be a non-empty string, got {self.name!r}")
        if self.kind not in COMPONENT_KINDS:
            found.append(f"{key}.kind: must be one of {list(COMPONENT_KINDS)}, got {self.kind!r}")
        for field_name in ("weight", "scale", "shift"):
            value = getattr(self, field_name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                found.append(f"{key}.{field_name}: must be a finite number, got {value}")
        if any(not isinstance(d, str) or not d for d in self.data_sources):
            found.append(f"{key}.data_sources: entries must be non-empty strings")
        if self.scorer is not None and (self.kind != "rule" or not self.scorer):
            found.append(f"{key}.scorer: only a rule component names a scorer (non-empty)")
        if self.kind == "model":
            if not self.model:
                found.append(f"{key}.model: required for a model component")
            if not (self.device == "cpu" or self.device.startswith("cuda")):
                found.append(f"{key}.device: must be cpu, cuda or cuda:N, got {self.device!r}")
            if self.dtype not in MODEL_DTYPES:
                found.append(f"{key}.dtype: must be one of {list(MODEL_DTYPES)}")
            found += [
                at_least(f"{key}.batch_size", self.batch_size, 1),
                at_least(f"{key}.max_length", self.max_length, 1),
            ]
            if self.label_index is not None:
                found.append(at_least(f"{key}.label_index", self.label_index, 0))
        elif self.model:
            found.append(f"{key}.model: only a model component has a model")
        return [line for line in found if line]


@dataclass
class RewardConfig:
    """How the reward service picks and runs scorers."""

    scorers: dict[str, str] = field(default_factory=dict)
    """User scorers: data_source → "package.module:function" (or "path/to/file.py:function").
    The function takes (response: str, ground_truth: str | None, extra_info: dict) and returns
    a float or bool. A user scorer wins over a built-in one for the same data_source."""
    default_data_source: str | None = None
    """Scorer used for items whose data_source is empty; None makes an empty data_source an
    error for that item. Unknown non-empty data_sources are always errors."""
    format_score: float = 0.0
    """Score the built-in rule scorers give a response whose answer is in the expected format
    but wrong (verl's ``format_score``); a missing or unparsable answer always scores 0."""
    gsm8k_method: Literal["strict", "flexible"] = "strict"
    """gsm8k answer extraction: "strict" (last "#### <number>") or "flexible" (last number in
    the response), as in verl."""
    num_threads: int = 1
    """Threads that score the items of one batch concurrently (1: score in the caller's thread)."""
    max_batch_size: int = 4096
    """Largest batch one score_batch call accepts; larger batches are rejected with ValueError."""
    max_items_per_request: int = 4096
    """Most items one Score call may carry (checked on the message before any conversion)."""
    max_text_bytes: int = 1024 * 1024
    """Largest UTF-8 size of any one text field of an item (response, ground truth, prompt,
    extra_info_json)."""
    components: list[RewardComponent] = field(default_factory=list)
    """Combined reward: each item's score is the weighted sum of the components that apply
    to it (an item no component applies to gets an error). Empty: the data_source's rule
    scorer alone, with no per-component scores."""
    torch_threads: int = 1
    """torch threads of the reward service process, set only when a model component is
    configured (without one the service never imports torch)."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits of the reward service."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        raise_problems(
            [
                within("reward.format_score", self.format_score, -1.0, 1.0),
                at_least("reward.num_threads", self.num_threads, 1),
                at_least("reward.max_batch_size", self.max_batch_size, 1),
                at_least("reward.torch_threads", self.torch_threads, 1),
                *self._component_problems(),
            ]
        )
        for data_source, path in self.scorers.items():
            if not isinstance(data_source, str) or not data_source:
                raise ValueError(
                    f"reward.scorers: keys must be non-empty strings, got {data_source!r}"
                )
            if not isinstance(path, str) or ":" not in path:
                raise ValueError(
                    f"reward.scorers[{data_source!r}]: expected 'package.module:function' "
                    f"or 'path/to/file.py:function', got {path!r}"
                )
        if self.default_data_source is not None and not self.default_data_source:
            raise ValueError("reward.default_data_source must be a non-empty string or null")
        if self.gsm8k_method not in GSM8K_METHODS:
            raise ValueError(
                f"reward.gsm8k_method must be one of {GSM8K_METHODS}, got {self.gsm8k_method!r}"
            )
        if self.num_threads < 1:
            raise ValueError(f"reward.num_threads must be >= 1, got {self.num_threads}")
        if self.max_batch_size < 1:
            raise ValueError(f"reward.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_items_per_request < 1:
            raise ValueError(
                f"reward.max_items_per_request must be >= 1, got {self.max_items_per_request}"
            )
        if self.max_text_bytes < 1:
            raise ValueError(f"reward.max_text_bytes must be >= 1, got {self.max_text_bytes}")
        self.server.validate()

    def _component_problems(self) -> list[str]:
        found: list[str] = []
        seen: set[str] = set()
        for i, component in enumerate(self.components):
            key = f"reward.components[{i}]"
            found += component.problems(key)
            if component.name in seen:
                found.append(f"{key}.name: {component.name!r} is used by an earlier component")
            seen.add(component.name)
        return found

    def model_components(self) -> list[RewardComponent]:
        """The components of kind "model"."""
        return [c for c in self.components if c.kind == "model"]
