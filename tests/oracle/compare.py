"""How an update is compared with TRL's: the tolerances, and the one place that knows where
AdamW turns float rounding into a visible weight difference.

Measured (``python -m tests.oracle.figures``, docs/trl-parity.md): no gradient of the tiny
Llama is exactly 0 (the tied head gives every embedding row one), and after one or two steps
every weight is within 1e-6 of TRL's but for one of its 25,056, in 7 of the 12 settings. Each
of those had a gradient below AdamW's eps (1.3e-9 to 8.4e-9). AdamW's first step is
``lr * g / (|g| + eps)``: about ``lr`` whatever ``|g|`` is, but steep where ``|g|`` is near
eps (slope ``lr * eps / (|g| + eps) ** 2``), so the rounding difference of such a gradient
(about 1e-10, from summation order) moves the weight by up to ``lr * dg / eps``: 4.3e-5 at lr
1e-3. A later step divides by ``sqrt(v_hat)``, the running RMS of the weight's gradients, so
the same holds wherever that is small. Those weights are held to what AdamW steps can differ
by; every other weight to the tolerance.
"""

from __future__ import annotations

import pytest
import torch

from tests.oracle.trl_oracle import StepResult

TOL = 1e-6
GRAD_TOL = 1e-7
ADAM_EPS = 1e-8
ADAM_BETA2 = 0.999
"""torch's AdamW defaults, and transformers' ``adam_epsilon`` / ``adam_beta2``: both sides'."""
STEEP = 10 * ADAM_EPS
"""Below this AdamW denominator (``sqrt(v_hat)``; at the first step ``|g|``) a weight's step
is steep in its gradient. At 10 eps the first step's slope is ``lr / (121 eps)``, which turns
a 3e-10 rounding into 2.5e-7 at lr 1e-3; at eps it would be 7.5e-6."""
STEP_SPREAD = 3.0
"""In lr, how far two AdamW steps can be apart: each is at most 1.16 lr long in the first 20
steps at betas (0.9, 0.999) (Cauchy-Schwarz on ``m_hat / sqrt(v_hat)``)."""
TIGHT_SHARE = 0.99
"""At least this share of the weights must be held to the tolerance (measured: 99.77% to
99.97%), so the loose bound of the steep ones cannot make the check weak."""


def adam_denominators(grad_steps: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """After each step, per element, the smallest AdamW denominator so far: the square root
    of the bias-corrected running mean of the squared gradients (``v_hat``), in float64."""
    second: dict[str, torch.Tensor] = {}
    floor: dict[str, torch.Tensor] = {}
    out = []
    for step, grads in enumerate(grad_steps, start=1):
        for name, grad in grads.items():
            squared = (1 - ADAM_BETA2) * grad.double() ** 2
            second[name] = squared if name not in second else ADAM_BETA2 * second[name] + squared
            denominator = (second[name] / (1 - ADAM_BETA2**step)).sqrt()
            seen = floor.get(name)
            floor[name] = denominator if seen is None else torch.minimum(seen, denominator)
        out.append(dict(floor))
    return out


def both_sides_floor(
    a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]
) -> list[dict[str, torch.Tensor]]:
    """Per step, the smaller of two sides' ``adam_denominators`` (a step is steep if either
    side's is)."""
    return [{k: torch.minimum(x[k], y[k]) for k in x} for x, y in zip(a, b, strict=True)]


def weight_bounds(floor: torch.Tensor, lr: float, tol: float, steps: int) -> torch.Tensor:
    """Per weight: ``tol``, or where its AdamW denominator fell below STEEP, how far ``steps``
    AdamW steps can be apart (``steps * STEP_SPREAD * lr``)."""
    return torch.where(
        floor >= STEEP,
        torch.full_like(floor, tol, dtype=torch.float32),
        torch.full_like(floor, steps * STEP_SPREAD * lr, dtype=torch.float32),
    )


def assert_weights_close(
    want: dict[str, torch.Tensor],
    got: dict[str, torch.Tensor],
    floor: dict[str, torch.Tensor],
    lr: float,
    tol: float,
    steps: int,
) -> int:
    """Every weight of ``got`` within ``weight_bounds`` of ``want`` (weights without a
    gradient, never stepped, within ``tol``), and at least TIGHT_SHARE of them held to
    ``tol``. Returns how many were steep (held to the loose bound)."""
    assert want.keys() == got.keys()
    steep = total = 0
    for name, value in want.items():
        diff = (got[name] - value).abs()
        if name in floor:
            bound = weight_bounds(floor[name], lr, tol, steps)
            steep += int((floor[name] < STEEP).sum())
        else:
            bound = torch.full_like(diff, tol)
        worst = int((diff - bound).argmax())
        assert bool((diff <= bound).all()), (
            f"{name}[{worst}]: {float(diff.flatten()[worst]):.3g} > "
            f"{float(bound.flatten()[worst]):.3g}"
        )
        total += diff.numel()
    assert steep <= (1 - TIGHT_SHARE) * total, f"{steep} of {total} weights steep: a weak check"
    return steep


def split_diffs(
    want: dict[str, torch.Tensor], got: dict[str, torch.Tensor], floor: dict[str, torch.Tensor]
) -> tuple[float, float, int]:
    """The largest difference of the weights held to the tolerance, the largest of the steep
    ones, and how many are steep (the figures of ``assert_weights_close``)."""
    tight = steep = 0.0
    num_steep = 0
    for name, value in want.items():
        diff = (got[name] - value).abs()
        is_steep = (
            floor[name] < STEEP if name in floor else torch.zeros_like(diff, dtype=torch.bool)
        )
        num_steep += int(is_steep.sum())
        tight = max(tight, _largest(diff[~is_steep]))
        steep = max(steep, _largest(diff[is_steep]))
    return tight, steep, num_steep


def _largest(values: torch.Tensor) -> float:
    return float(values.max()) if values.numel() else 0.0


def max_param_diff(a: StepResult, b: StepResult) -> dict[str, float]:
    assert a.params.keys() == b.params.keys()
    return {k: float((a.params[k] - b.params[k]).abs().max()) for k in a.params}


def assert_same_update(
    trl: StepResult, ours: StepResult, lr: float, loss: bool = True, steps: int = 1
) -> None:
    """Advantages, loss and gradient norm within TOL; the clipped gradients within GRAD_TOL;
    the weights after ``steps`` AdamW steps within ``steps * TOL``, but for the few whose
    AdamW denominator fell below STEEP (``assert_weights_close``).

    ``steps * TOL``: a steep weight's difference (up to ``lr * dg / eps``) changes the next
    step's gradients of the others a little. Measured at DPO's second step: by up to 4e-8,
    moving weights whose gradients are 1e-5 by up to 7.7e-7."""
    assert ours.advantages == pytest.approx(trl.advantages, abs=TOL)
    if loss:
        assert ours.loss == pytest.approx(trl.loss, rel=TOL, abs=TOL)
    assert ours.grad_norm == pytest.approx(trl.grad_norm, rel=TOL, abs=TOL)
    assert ours.grads.keys() == trl.grads.keys() and ours.grads.keys()
    for name, grad in trl.grads.items():
        torch.testing.assert_close(ours.grads[name], grad, rtol=0, atol=GRAD_TOL, msg=name)
    assert len(trl.grad_steps) == len(ours.grad_steps) == steps
    floor = both_sides_floor(adam_denominators(trl.grad_steps), adam_denominators(ours.grad_steps))
    assert_weights_close(trl.params, ours.params, floor[-1], lr, steps * TOL, steps)
