"""Configuration of the reward service (imports without torch or grpc).

This module only describes and validates settings; it does not import user scorers (that
happens in ``hybridflow.services.reward.registry`` when the registry is built).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems
from hybridflow.rpc.config import ServerConfig
from hybridflow.sandbox.config import SandboxConfig

MODEL_ONLY = ("dtype", "batch_size", "max_length", "label_index")
"""Fields of a component bounded only when its kind is model (a rule component ignores them)."""


@dataclass
class RewardComponent:
    """One term of a combined reward: a rule scorer or a reward model, with a weight.

    An item's final score is the sum of ``weight * score`` over the components that apply to
    it; each component's own (unweighted) score is reported in ``ScoreResult.components``.
    """

    name: str = knob("", free="a label; non-empty and unique among the components (validate)")
    """Unique, non-empty; names the score in ``ScoreResult.components`` and the batch metric
    ``reward/<name>/mean``."""
    kind: Literal["rule", "model"] = "rule"
    """"rule": a registered scorer; "model": a sequence-classification checkpoint."""
    weight: float = knob(1.0, finite=True)
    """Multiplies this component's score in the sum (any finite number, 0 included)."""
    data_sources: list[str] = knob(
        default_factory=list, free="data_source names or prefixes; non-empty (validate)"
    )
    """Applies only to items whose data_source equals or starts with one of these (as the
    registry matches); empty: applies to every item."""
    scorer: str | None = knob(None, free="a scorer name, resolved when the service starts")
    """kind rule: a registered scorer name (built-in, verl alias or a ``reward.scorers`` key)
    that scores every item it applies to; None: the item's data_source picks, as without
    components."""
    model: str = knob("", free="a model name or directory, checked when the model loads")
    """kind model: ``builtin:tiny-rm`` or a local checkpoint directory (required)."""
    device: str = knob("cpu", free="a torch device: cpu, cuda or cuda:N (validate)")
    """kind model: torch device of the model ("cpu", "cuda", "cuda:1")."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """kind model: parameter dtype; scores are returned as float64 either way."""
    batch_size: int = knob(32, ge=1)
    """kind model: items per forward pass (right-padded, with attention mask)."""
    max_length: int = knob(512, ge=1)
    """kind model: most tokens of prompt + response an item may have."""
    truncate: bool = False
    """kind model: an item longer than max_length keeps its last max_length tokens (and is
    counted in the service's ``truncated`` counter) instead of getting an error."""
    label_index: int | None = knob(None, ge=0)
    """kind model: which logit is the score. None requires a model with num_labels == 1
    (loading another is refused); an index picks that logit of a multi-label head."""
    sigmoid: bool = False
    """kind model: score = scale * sigmoid(logit) + shift instead of scale * logit + shift."""
    scale: float = knob(1.0, finite=True)
    """kind model: multiplies the (sigmoid of the) logit."""
    shift: float = knob(0.0, finite=True)
    """kind model: added after scaling."""

    def problems(self, key: str) -> list[str]:
        """Problem lines of this component, each naming ``key.<field>``: each field's bound
        (those of ``MODEL_ONLY`` for a model component only), a non-empty name and data
        sources, and the fields that belong to the other kind."""
        skip = () if self.kind == "model" else MODEL_ONLY
        found = [
            *field_problems(self, key, skip=skip),
            None
            if isinstance(self.name, str) and self.name.strip()
            else f"{key}.name: must be a non-empty string, got {self.name!r}",
            f"{key}.data_sources: entries must be non-empty strings"
            if any(not isinstance(d, str) or not d for d in self.data_sources)
            else None,
            f"{key}.scorer: only a rule component names a scorer (non-empty)"
            if self.scorer is not None and (self.kind != "rule" or not self.scorer)
            else None,
            *self._kind_problems(key),
        ]
        return [line for line in found if line]

    def _kind_problems(self, key: str) -> list[str]:
        """A model component needs its model and a cuda or cpu device; a rule one has none."""
        if self.kind != "model":
            return [f"{key}.model: only a model component has a model"] if self.model else []
        found = [] if self.model else [f"{key}.model: required for a model component"]
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            found.append(f"{key}.device: must be cpu, cuda or cuda:N, got {self.device!r}")
        return found


@dataclass
class RewardConfig:
    """How the reward service picks and runs scorers."""

    RENAMED_KEYS = {"num_threads": "score_workers"}

    scorers: dict[str, str] = knob(
        default_factory=dict, free="import paths, loaded when the service starts (validate)"
    )
    """User scorers: data_source → "package.module:function" (or "path/to/file.py:function").
    The function takes (response: str, ground_truth: str | None, extra_info: dict) and returns
    a float or bool. A user scorer wins over a built-in one for the same data_source."""
    default_data_source: str | None = knob(
        None, free="a data_source name (non-empty: validate), resolved by the registry"
    )
    """Scorer used for items whose data_source is empty; None makes an empty data_source an
    error for that item. Unknown non-empty data_sources are always errors."""
    format_score: float = knob(0.0, ge=-1, le=1)
    """Score the built-in rule scorers give a response whose answer is in the expected format
    but wrong (verl's ``format_score``); a missing or unparsable answer always scores 0."""
    gsm8k_method: Literal["strict", "flexible"] = "strict"
    """gsm8k answer extraction: "strict" (last "#### <number>") or "flexible" (last number in
    the response), as in verl."""
    math_method: Literal["rules", "math_verify"] = "rules"
    """What scores ``math`` (and verl's MATH dataset names): "rules" (the last ``\boxed{}``,
    normalised and compared as text or number) or "math_verify" (Hugging Face's math-verify:
    LaTeX, fractions, sets, intervals, equations). The ``math_verify`` data_source always
    scores with math-verify."""
    math_verify_timeout_s: float = knob(10.0, gt=0, le=600)
    """Deadline of one math-verify check; its process is killed past it and that item alone
    fails (``math_verify_scorer.py``)."""
    code_score: Literal["fraction", "all"] = "fraction"
    """What the ``code`` scorer gives a program: the fraction of its tests it passes, or 1
    only when it passes all of them (``code_scorer.py``)."""
    code_cache_size: int = knob(4096, ge=0)
    """Verdicts the ``code`` scorer keeps, so an identical program against identical tests
    is run once (0: run every one); verdicts from a limit (timeout, cpu, memory, output) are
    never kept."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The sandbox pool the ``code`` scorer runs programs in (started on the first code
    item; a machine that cannot sandbox fails that Score call, naming why). Its ``workers``
    programs run at once, so a batch of code items is scored by that many threads."""
    score_workers: int = knob(1, ge=1)
    """Threads that score the items of one batch concurrently (1: score in the caller's
    thread). Was ``num_threads``, which elsewhere means torch threads (here: torch_threads)."""
    max_batch_size: int = knob(4096, ge=1)
    """Largest batch one score_batch call accepts; larger batches are rejected with ValueError."""
    max_items_per_request: int = knob(4096, ge=1)
    """Most items one Score call may carry (checked on the message before any conversion)."""
    max_text_bytes: int = knob(1024 * 1024, ge=1)
    """Largest UTF-8 size of any one text field of an item (response, ground truth, prompt,
    extra_info_json)."""
    components: list[RewardComponent] = field(default_factory=list)
    """Combined reward: each item's score is the weighted sum of the components that apply
    to it (an item no component applies to gets an error). Empty: the data_source's rule
    scorer alone, with no per-component scores."""
    torch_threads: int = knob(1, ge=1)
    """torch threads of the reward service process, set only when a model component is
    configured (without one the service never imports torch)."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits of the reward service."""

    def validate(self) -> None:
        """Raise ValueError naming every bad field: each field's bound and each component's,
        plus scorer paths that name a function, a non-empty default_data_source and unique
        component names."""
        raise_problems(
            [
                *field_problems(self, "reward"),
                *self._scorer_problems(),
                "reward.default_data_source must be a non-empty string or null"
                if self.default_data_source == ""
                else None,
                *self._component_problems(),
            ]
        )
        self.server.validate()
        self.sandbox.validate("reward.sandbox")

    def _scorer_problems(self) -> list[str]:
        """Each user scorer: a non-empty data_source key and a ``module:function`` path."""
        found: list[str] = []
        for data_source, path in self.scorers.items():
            if not isinstance(data_source, str) or not data_source:
                found.append(f"reward.scorers: keys must be non-empty strings, got {data_source!r}")
            elif not isinstance(path, str) or ":" not in path:
                found.append(
                    f"reward.scorers[{data_source!r}]: expected 'package.module:function' "
                    f"or 'path/to/file.py:function', got {path!r}"
                )
        return found

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
