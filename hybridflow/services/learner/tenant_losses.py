"""Tinker's built-in losses, as the tenant engine (``tenants.py``) computes them: each one's
inputs, its ``loss_fn_config`` keys with their defaults, and its value, a sum over every real
token (not a mean). ``target_lp`` is the trained model's log-prob of each target token;
``logprobs`` in the inputs the sampler's.

* ``cross_entropy``: ``-sum(weights * target_lp)``.
* ``importance_sampling``: ``-sum(ratio * advantages)``, ``ratio = exp(target_lp - logprobs)``.
* ``ppo``: ``-sum(min(ratio * A, clip(ratio, low, high) * A))``; low 0.8, high 1.2.
* ``cispo``: ``-sum(sg(clip(ratio, low, high)) * target_lp * A)`` (``sg``: no gradient); low
  0.0, high 4.0: only the upper side clipped unless the call says otherwise.
* ``dro``: ``-sum(target_lp * A - beta / 2 * (target_lp - logprobs)^2)``; ``beta`` has no
  default here (the call gives it): a guessed one would train a different objective quietly.

A key a loss does not read is refused, never ignored. Knows torch, not peft or the wire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.errors import BadRequest

if TYPE_CHECKING:
    import torch

_POLICY = ("target_tokens", "logprobs", "advantages")
INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": _POLICY,
    "ppo": _POLICY,
    "cispo": _POLICY,
    "dro": _POLICY,
}
"""Each built-in loss's ``loss_fn_inputs`` (``weights`` may be left out: all ones)."""
LOSSES = tuple(INPUTS)

_REQUIRED = object()
CONFIG: dict[str, dict[str, object]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": _REQUIRED},
}
"""Each loss's ``loss_fn_config`` keys and their defaults (``_REQUIRED``: the call must give it)."""


class LossConfigError(BadRequest):
    """A ``loss_fn_config`` the loss cannot use: a key it does not read, one it needs missing,
    or clip thresholds the wrong way round."""


def resolve_config(loss_fn: str, given: dict[str, float]) -> dict[str, float]:
    """``given`` over the loss's defaults; LossConfigError for a key it does not read, a
    required one missing or ``clip_low_threshold`` above ``clip_high_threshold``."""
    known = CONFIG[loss_fn]
    unknown = sorted(set(given) - set(known))
    if unknown:
        reads = ", ".join(known) or "no keys"
        raise LossConfigError(
            f"loss_fn_config {unknown} is not read by {loss_fn} (it reads {reads})"
        )
    out: dict[str, float] = {}
    for key, default in known.items():
        if key in given:
            out[key] = float(given[key])
        elif default is _REQUIRED:
            raise LossConfigError(f"{loss_fn} needs loss_fn_config[{key!r}]")
        else:
            out[key] = float(default)  # type: ignore[arg-type]
    if out.get("clip_low_threshold", 0.0) > out.get("clip_high_threshold", float("inf")):
        raise LossConfigError(
            f"clip_low_threshold {out['clip_low_threshold']} is above clip_high_threshold "
            f"{out['clip_high_threshold']}"
        )
    return out


def loss(
    loss_fn: str, target_lp: torch.Tensor, batch: dict[str, torch.Tensor], config: dict[str, float]
) -> torch.Tensor:
    """The loss ``loss_fn`` over the padded ``batch`` (``mask`` marks real tokens), with the
    resolved ``config`` (:func:`resolve_config`)."""
    import torch

    mask = batch["mask"].float()
    if loss_fn == "cross_entropy":
        return -(target_lp * batch["weights"] * mask).sum()
    advantages = batch["advantages"]
    log_ratio = target_lp - batch["logprobs"]
    if loss_fn == "dro":
        objective = target_lp * advantages - 0.5 * config["beta"] * log_ratio**2
        return -(objective * mask).sum()
    ratio = torch.exp(log_ratio)
    if loss_fn == "importance_sampling":
        return -(ratio * advantages * mask).sum()
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    if loss_fn == "cispo":
        return -(clipped.detach() * target_lp * advantages * mask).sum()
    return -(torch.minimum(ratio * advantages, clipped * advantages) * mask).sum()
