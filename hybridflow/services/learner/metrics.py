"""Metric accumulation for one train step, reduced over ranks once at the end.

Three kinds: *sums* (partial sums already divided by global counts, so the sum over
micro-batches and ranks is the global mean), *maxima* / *minima* (reduced with MAX), and
*globals* (values every rank of its group already knows, e.g. computed from the whole batch).
With the critic on its own ranks the actor and critic ranks record different keys: ``reduce``
first agrees on the union (a missing sum counts 0, a missing extremum nothing) and merges the
globals of every rank. This module knows nothing about models or losses.
"""

from __future__ import annotations

import math

import torch

from hybridflow.services.learner.distributed import (
    all_gather_objects,
    all_reduce_max,
    all_reduce_sum,
)


class StepMetrics:
    """Collects one train step's metrics; ``reduce`` returns plain floats."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sums: dict[str, torch.Tensor] = {}
        self._maxima: dict[str, torch.Tensor] = {}
        self._globals: dict[str, float] = {}

    def add(self, name: str, value: torch.Tensor | float, scale: float = 1.0) -> None:
        """Adds a partial sum (``value * scale``)."""
        tensor = torch.as_tensor(value, dtype=torch.float64, device=self.device).detach() * scale
        self._sums[name] = (
            self._sums.get(name, torch.zeros((), dtype=torch.float64, device=self.device)) + tensor
        )

    def max(self, name: str, value: torch.Tensor | float) -> None:
        """Keeps the running maximum."""
        tensor = torch.as_tensor(value, dtype=torch.float64, device=self.device).detach()
        old = self._maxima.get(name)
        self._maxima[name] = tensor if old is None else torch.maximum(old, tensor)

    def min(self, name: str, value: torch.Tensor | float) -> None:
        """Keeps the running minimum (stored as a negated maximum)."""
        self.max("\x00min:" + name, -torch.as_tensor(value, dtype=torch.float64))

    def set_global(self, name: str, value: float) -> None:
        """A value every rank holds already (not reduced)."""
        self._globals[name] = float(value)

    def add_global(self, name: str, value: float, scale: float = 1.0) -> None:
        """Adds to a value every rank holds already (not reduced)."""
        self._globals[name] = self._globals.get(name, 0.0) + float(value) * scale

    def reduce(self) -> dict[str, float]:
        """All-reduce sums (SUM) and extrema (MAX) over ranks; every rank must call it."""
        parts = all_gather_objects((sorted(self._sums), sorted(self._maxima), self._globals))
        out: dict[str, float] = {}
        for _, _, globals_ in parts:
            out.update(globals_)
        sum_names = sorted({n for names, _, _ in parts for n in names})
        if sum_names:
            zero = torch.zeros((), dtype=torch.float64, device=self.device)
            stacked = all_reduce_sum(torch.stack([self._sums.get(n, zero) for n in sum_names]))
            out.update({n: float(v) for n, v in zip(sum_names, stacked.tolist(), strict=True)})
        max_names = sorted({n for _, names, _ in parts for n in names})
        if max_names:
            lowest = torch.tensor(-math.inf, dtype=torch.float64, device=self.device)
            stacked = all_reduce_max(torch.stack([self._maxima.get(n, lowest) for n in max_names]))
            for n, v in zip(max_names, stacked.tolist(), strict=True):
                if n.startswith("\x00min:"):
                    out[n[len("\x00min:") :]] = -v
                else:
                    out[n] = v
        return out


def masked_extrema(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """``(max, min)`` of ``values`` where ``mask`` > 0; ``(-inf, inf)`` when the mask is empty."""
    selected = values[mask > 0]
    if selected.numel() == 0:
        return -math.inf, math.inf
    return float(selected.max()), float(selected.min())
