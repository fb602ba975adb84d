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

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems

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
MAX_PROMPT_LEN = 100_000
"""Longest generated prompt in tokens."""

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

    prompt_len_min: int = knob(16, ge=1, le=MAX_PROMPT_LEN)
    """Shortest prompt in tokens (ids drawn uniformly from the vocabulary, EOS excluded)."""
    prompt_len_max: int = knob(16, ge=1, le=MAX_PROMPT_LEN)
    """Longest prompt in tokens; equal to prompt_len_min for a fixed length."""
    max_new_tokens: int = knob(16, ge=1)
    """Upper bound on generated tokens per completion."""
    temperature: float = knob(1.0, ge=0)
    """Softmax temperature; 0 means greedy."""
    top_p: float = knob(1.0, gt=0, le=1)
    """Nucleus sampling mass in (0, 1]."""
    n: int = knob(1, ge=1)
    """Completions per prompt."""
    prompts_per_request: int = knob(1, ge=1)
    """Prompts in each request (the batch size)."""

    def validate(self) -> None:
        """Each field's bound, plus: the shortest prompt no longer than the longest."""
        raise_problems(
            [
                *field_problems(self, "rollout"),
                "rollout.prompt_len_min/prompt_len_max: must satisfy min <= max, "
                f"got {self.prompt_len_min}..{self.prompt_len_max}"
                if self.prompt_len_min > self.prompt_len_max
                else None,
            ]
        )


@dataclass
class RewardLoadConfig:
    """Shape of each Score request (``arith`` items with random responses)."""

    items_per_request: int = knob(8, ge=1)
    """Items in each request."""
    correct_fraction: float = knob(0.5, ge=0, le=1)
    """Probability that an item's response equals its ground truth."""
    max_operand: int = knob(99, ge=0)
    """Operands of the arith prompts are drawn from 0..max_operand."""

    def validate(self) -> None:
        """Each field's bound (no checks between fields)."""
        raise_problems(field_problems(self, "reward"))


@dataclass
class LoadgenConfig:
    """One load-generator invocation: a single run or a sweep of runs."""

    target: Target = "rollout"
    """Which service the address serves: "rollout" or "reward"."""
    address: str = knob("", free="one HOST:PORT, parsed by check_address (validate)")
    """HOST:PORT of the one service to load (required; never a wildcard, never a range)."""
    rate: float = knob(0.0, ge=0, le=MAX_RATE)
    """Open loop: Poisson arrivals at this many requests/s (0 = not open loop)."""
    concurrency: int = knob(0, ge=0, le=MAX_CONCURRENCY)
    """Closed loop: this many requests always in flight (0 = not closed loop)."""
    duration_s: float = knob(0.0, ge=0, le=MAX_DURATION_S)
    """Stop sending after this many seconds, warm-up included (0 = only the request bound)."""
    num_requests: int = knob(0, ge=0, le=MAX_REQUESTS)
    """Stop after sending this many requests, warm-up ones included (0 = only the duration)."""
    warmup_s: float = knob(0.0, ge=0)
    """Requests sent in the first warmup_s seconds are excluded from the statistics."""
    timeout_s: float = knob(30.0, gt=0, le=MAX_TIMEOUT_S)
    """Deadline of each request; it also bounds the drain after sending stops."""
    seed: int = knob(0, free="any integer; it only seeds the generators")
    """Seeds the arrival schedule and the request contents."""
    sweep_rates: list[float] = knob(default_factory=list, gt=0, le=MAX_RATE)
    """Run one open-loop point per rate (requests/s) instead of a single run."""
    sweep_concurrency: list[int] = knob(default_factory=list, ge=1, le=MAX_CONCURRENCY)
    """Run one closed-loop point per concurrency instead of a single run."""
    out: str = knob("", free="a file path, written when the run ends")
    """Write the JSON report here (empty = print only)."""
    plot: str = knob("", free="a file path (a .png: validate), written when a sweep ends")
    """Sweeps: write the latency-vs-throughput PNG here (default: ``out`` with .png)."""
    rollout: RolloutLoadConfig = field(default_factory=RolloutLoadConfig)
    """Request shape when target is "rollout"."""
    reward: RewardLoadConfig = field(default_factory=RewardLoadConfig)
    """Request shape when target is "reward"."""

    def validate(self) -> None:
        """One parsable address, then each field's bound, plus: exactly one load pattern, a
        bound on the run (duration and/or requests), a warm-up shorter than the duration and
        a .png plot path; then the request shapes."""
        check_address(self.address)
        patterns = [self.rate, self.concurrency, self.sweep_rates, self.sweep_concurrency]
        raise_problems(
            [
                *field_problems(self, ""),
                "rate: give exactly one of rate, concurrency, sweep_rates, sweep_concurrency"
                if sum(map(bool, patterns)) != 1
                else None,
                "duration_s: give duration_s and/or num_requests to bound the run"
                if not self.duration_s and not self.num_requests
                else None,
                f"warmup_s: must be < duration_s, got {self.warmup_s} ({self.duration_s})"
                if self.duration_s and self.warmup_s >= self.duration_s
                else None,
                f"plot: must be a .png path, got {self.plot!r}"
                if self.plot and not self.plot.endswith(".png")
                else None,
            ]
        )
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
