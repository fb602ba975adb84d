"""Configuration of a load-generator run: target, load pattern, bounds and request shape.

Imports neither grpc nor torch. Knows nothing of how requests are sent; it only says what
to send, how often, and when to stop. Every run is bounded: a missing bound falls back to a
hard cap (``MAX_DURATION_S`` / ``MAX_REQUESTS``) so the generator always stops by itself.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

MAX_DURATION_S = 3600.0
"""No run sends for longer than this, whatever the flags say."""
MAX_REQUESTS = 1_000_000
"""No run sends more requests than this, whatever the flags say."""
MAX_TIMEOUT_S = 600.0
"""Largest per-request deadline; bounds the drain after sending stops."""
MAX_CONCURRENCY = 1024
"""Largest closed-loop concurrency."""
MAX_RATE = 100_000.0
"""Largest open-loop rate in requests/s."""

_UNSPECIFIED_HOSTS = {"", "*", "0.0.0.0", "::", "[::]"}

Target = Literal["rollout", "reward"]
Mode = Literal["open", "closed"]


def check_address(address: str) -> tuple[str, int]:
    """Parses one ``HOST:PORT``; refuses empty, wildcard and unspecified addresses or ranges."""
    text = address.strip()
    if not text:
        raise ValueError("address: required (HOST:PORT of one running service)")
    if any(c in text for c in ",/* ") or text.startswith("unix:"):
        raise ValueError(f"address: must be exactly one HOST:PORT, got {address!r}")
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"address: missing ':PORT' in {address!r}")
    if host in _UNSPECIFIED_HOSTS:
        raise ValueError(f"address: {host or 'an empty host'!r} is not a target; name one host")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(bare)
    except ValueError:
        ip = None  # a hostname
        if ":" in bare:
            raise ValueError(f"address: cannot parse host {host!r}") from None
    if ip is not None and ip.is_unspecified:
        raise ValueError(f"address: {host!r} is unspecified; name one host")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"address: port must be in [1, 65535], got {port_text!r}")
    return bare, int(port_text)


def is_loopback(address: str) -> bool:
    """True for localhost / 127.0.0.0/8 / ::1 (after ``check_address``)."""
    host, _ = check_address(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class RolloutLoadConfig:
    """Shape of each Generate request."""

    prompt_len_min: int = 16
    """Shortest prompt in tokens (ids drawn uniformly from the vocabulary, EOS excluded)."""
    prompt_len_max: int = 16
    """Longest prompt in tokens; equal to prompt_len_min for a fixed length."""
    max_new_tokens: int = 16
    """Upper bound on generated tokens per completion."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    n: int = 1
    """Completions per prompt."""
    prompts_per_request: int = 1
    """Prompts in each request (the batch size)."""

    def validate(self) -> None:
        if not 1 <= self.prompt_len_min <= self.prompt_len_max <= 100_000:
            raise ValueError(
                "rollout.prompt_len_min/prompt_len_max must satisfy 1 <= min <= max <= 100000, "
                f"got {self.prompt_len_min}..{self.prompt_len_max}"
            )
        if self.max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0.0:
            raise ValueError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"rollout.n must be >= 1, got {self.n}")
        if self.prompts_per_request < 1:
            raise ValueError(
                f"rollout.prompts_per_request must be >= 1, got {self.prompts_per_request}"
            )


@dataclass
class RewardLoadConfig:
    """Shape of each Score request (``arith`` items with random responses)."""

    items_per_request: int = 8
    """Items in each request."""
    correct_fraction: float = 0.5
    """Probability that an item's response equals its ground truth."""
    max_operand: int = 99
    """Operands of the arith prompts are drawn from 0..max_operand."""

    def validate(self) -> None:
        if self.items_per_request < 1:
            raise ValueError(f"reward.items_per_request must be >= 1, got {self.items_per_request}")
        if not 0.0 <= self.correct_fraction <= 1.0:
            raise ValueError(
                f"reward.correct_fraction must be in [0, 1], got {self.correct_fraction}"
            )
        if self.max_operand < 0:
            raise ValueError(f"reward.max_operand must be >= 0, got {self.max_operand}")


@dataclass
class LoadgenConfig:
    """One load-generator invocation: a single run or a sweep of runs."""

    target: Target = "rollout"
    """Which service the address serves: "rollout" or "reward"."""
    address: str = ""
    """HOST:PORT of the one service to load (required; never a wildcard, never a range)."""
    rate: float = 0.0
    """Open loop: Poisson arrivals at this many requests/s (0 = not open loop)."""
    concurrency: int = 0
    """Closed loop: this many requests always in flight (0 = not closed loop)."""
    duration_s: float = 0.0
    """Stop sending after this many seconds, warm-up included (0 = only the request bound)."""
    num_requests: int = 0
    """Stop after sending this many requests, warm-up ones included (0 = only the duration)."""
    warmup_s: float = 0.0
    """Requests sent in the first warmup_s seconds are excluded from the statistics."""
    timeout_s: float = 30.0
    """Deadline of each request; it also bounds the drain after sending stops."""
    seed: int = 0
    """Seeds the arrival schedule and the request contents."""
    sweep_rates: list[float] = field(default_factory=list)
    """Run one open-loop point per rate (requests/s) instead of a single run."""
    sweep_concurrency: list[int] = field(default_factory=list)
    """Run one closed-loop point per concurrency instead of a single run."""
    out: str = ""
    """Write the JSON report here (empty = print only)."""
    plot: str = ""
    """Sweeps: write the latency-vs-throughput PNG here (default: ``out`` with .png)."""
    rollout: RolloutLoadConfig = field(default_factory=RolloutLoadConfig)
    """Request shape when target is "rollout"."""
    reward: RewardLoadConfig = field(default_factory=RewardLoadConfig)
    """Request shape when target is "reward"."""

    def validate(self) -> None:
        if self.target not in ("rollout", "reward"):
            raise ValueError(f"target must be 'rollout' or 'reward', got {self.target!r}")
        check_address(self.address)
        patterns = [
            bool(self.rate),
            bool(self.concurrency),
            bool(self.sweep_rates),
            bool(self.sweep_concurrency),
        ]
        if sum(patterns) != 1:
            raise ValueError(
                "rate: give exactly one of rate, concurrency, sweep_rates, sweep_concurrency"
            )
        for mode, load in self.points():
            if mode == "open" and not 0.0 < load <= MAX_RATE:
                raise ValueError(f"rate must be in (0, {MAX_RATE:g}] requests/s, got {load}")
            if mode == "closed" and not 1 <= load <= MAX_CONCURRENCY:
                raise ValueError(f"concurrency must be in [1, {MAX_CONCURRENCY}], got {load:g}")
        if not self.duration_s and not self.num_requests:
            raise ValueError("duration_s: give duration_s and/or num_requests to bound the run")
        if not 0.0 <= self.duration_s <= MAX_DURATION_S:
            raise ValueError(
                f"duration_s must be in [0, {MAX_DURATION_S:g}], got {self.duration_s}"
            )
        if not 0 <= self.num_requests <= MAX_REQUESTS:
            raise ValueError(
                f"num_requests must be in [0, {MAX_REQUESTS}], got {self.num_requests}"
            )
        if self.warmup_s < 0 or (self.duration_s and self.warmup_s >= self.duration_s):
            raise ValueError(
                f"warmup_s must be >= 0 and < duration_s, got {self.warmup_s} ({self.duration_s})"
            )
        if not 0.0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}], got {self.timeout_s}")
        if self.plot and not self.plot.endswith(".png"):
            raise ValueError(f"plot must be a .png path, got {self.plot!r}")
        self.rollout.validate()
        self.reward.validate()

    @property
    def max_duration_s(self) -> float:
        """The duration bound actually enforced (the hard cap when none was given)."""
        return self.duration_s or MAX_DURATION_S

    @property
    def max_requests(self) -> int:
        """The request bound actually enforced (the hard cap when none was given)."""
        return self.num_requests or MAX_REQUESTS

    @property
    def is_sweep(self) -> bool:
        return bool(self.sweep_rates or self.sweep_concurrency)

    def points(self) -> list[tuple[Mode, float]]:
        """(mode, load) of every run: load is a rate (open) or a concurrency (closed)."""
        if self.sweep_rates:
            return [("open", r) for r in self.sweep_rates]
        if self.sweep_concurrency:
            return [("closed", float(c)) for c in self.sweep_concurrency]
        if self.rate:
            return [("open", self.rate)]
        return [("closed", float(self.concurrency))]

    def plot_path(self) -> str:
        """Where a sweep's PNG goes: ``plot``, else ``out`` with .png, else nowhere."""
        if self.plot:
            return self.plot
        if self.is_sweep and self.out:
            return str(Path(self.out).with_suffix(".png"))
        return ""
