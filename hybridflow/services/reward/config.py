"""Configuration of the reward service (imports without torch or grpc).

This module only describes and validates settings; it does not import user scorers (that
happens in ``hybridflow.services.reward.registry`` when the registry is built).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.ranges import at_least, raise_problems, within
from hybridflow.rpc.config import ServerConfig

GSM8K_METHODS = ("strict", "flexible")


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
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits of the reward service."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        raise_problems(
            [
                within("reward.format_score", self.format_score, -1.0, 1.0),
                at_least("reward.num_threads", self.num_threads, 1),
                at_least("reward.max_batch_size", self.max_batch_size, 1),
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
