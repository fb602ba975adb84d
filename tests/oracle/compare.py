"""How an update is compared with TRL's: tolerances, and the one place that knows how AdamW's
first steps amplify float rounding."""

from __future__ import annotations

import pytest
import torch

from tests.oracle.trl_oracle import StepResult

TOL = 1e-6
GRAD_TOL = 1e-7
ADAM_EPS = 1e-8


def weight_bounds(smallest: torch.Tensor, lr: float, steps: int) -> torch.Tensor:
    """Per weight, how far our AdamW weights may be from TRL's (``assert_same_update``)."""
    amplified = steps * lr * GRAD_TOL / (smallest + ADAM_EPS)
    return TOL + torch.clamp(amplified, max=steps * lr)


def max_param_diff(a: StepResult, b: StepResult) -> dict[str, float]:
    assert a.params.keys() == b.params.keys()
    return {k: float((a.params[k] - b.params[k]).abs().max()) for k in a.params}


def _max(values: torch.Tensor) -> float:
    return float(values.max()) if values.numel() else 0.0


def assert_same_update(
    trl: StepResult, ours: StepResult, lr: float, loss: bool = True, steps: int = 1
) -> None:
    """Advantages, loss and gradient norm within TOL; the clipped gradients within GRAD_TOL;
    each weight after AdamW within the bound its gradients allow.

    AdamW divides each gradient element by its own running magnitude, so a step moves a weight
    by about ``lr * g / |g|`` and a gradient error ``dg`` becomes a step error of about
    ``lr * dg / (|g| + eps)``. Different summation orders leave ``dg`` near 1e-8 here (held
    to GRAD_TOL), so a weight is held to ``TOL + steps * lr * GRAD_TOL / (|g| + eps)`` with
    ``|g|`` its smallest gradient over the steps, capped at ``steps * lr`` (no AdamW step is
    longer than ``lr``). Most weights have gradients far above ``lr * GRAD_TOL / TOL`` and are
    held to about TOL; the check insists that at least a fifth are (the rest are mostly
    embedding rows of tokens absent from the batch, whose gradient is 0)."""
    assert ours.advantages == pytest.approx(trl.advantages, abs=TOL)
    if loss:
        assert ours.loss == pytest.approx(trl.loss, rel=TOL, abs=TOL)
    assert ours.grad_norm == pytest.approx(trl.grad_norm, rel=TOL, abs=TOL)
    assert ours.grads.keys() == trl.grads.keys() and ours.grads.keys()
    for name, grad in trl.grads.items():
        torch.testing.assert_close(ours.grads[name], grad, rtol=0, atol=GRAD_TOL, msg=name)
    tight = total = 0
    for name, want in trl.params.items():
        diff = (ours.params[name] - want).abs()
        if name in trl.smallest:
            bound = weight_bounds(trl.smallest[name], lr, steps)
        else:  # no gradient: never stepped
            bound = torch.full_like(diff, TOL)
        worst = int((diff - bound).argmax())
        assert bool((diff <= bound).all()), (
            f"{name}[{worst}]: {float(diff.flatten()[worst]):.3g} > "
            f"{float(bound.flatten()[worst]):.3g}"
        )
        tight += int((bound <= 2 * TOL).sum())
        total += diff.numel()
    assert tight >= total // 5, f"only {tight} of {total} weights held to ~TOL: a weak check"
