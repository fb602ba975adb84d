"""AdamW's state laid out when the optimizer is built, not at its first step.

``torch.optim.AdamW`` allocates each parameter's ``exp_avg`` and ``exp_avg_sq`` (twice the
model) inside the first ``step``, after the first backward: in a process whose allocator
keeps freed memory (``hybridflow.utils.malloc``) they land in the holes the first step's
freed gradients left, and the second step's gradients then grow the heap again (the
0.5B-shape learner: 334k page faults and 15 kernel-s in its second step, 0 after). Allocated
first, before any activation or gradient, they sit under everything a step allocates and
frees, and a step reuses the same memory from the first on.

The state is what AdamW's own first step would create (zeros, a step count of 0 where that
step puts it), so the optimizer steps exactly as it would have. Knows torch optimizers only.
"""

from __future__ import annotations

import torch
from torch.optim.optimizer import _get_scalar_dtype


def lay_out_adam_state(optim: torch.optim.Optimizer) -> None:
    """Fills ``optim``'s empty state for every parameter as ``torch.optim.Adam`` /
    ``AdamW``'s first step would; other optimizers, and parameters with state, are left as
    they are."""
    if not isinstance(optim, torch.optim.Adam | torch.optim.AdamW):
        return
    for group in optim.param_groups:
        on_device = bool(group["capturable"] or group["fused"])
        for param in group["params"]:
            if not param.requires_grad or optim.state[param]:
                continue
            state = optim.state[param]
            # where AdamW's own first step puts the count: on the parameter's device when
            # capturable or fused, else a CPU scalar
            state["step"] = (
                torch.zeros(
                    (), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=param.device
                )
                if on_device
                else torch.tensor(0.0, dtype=_get_scalar_dtype())
            )
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format
                )
