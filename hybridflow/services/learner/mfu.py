"""Model FLOPs utilisation (MFU) of a learner train step, and its devices' peak FLOPs.

The estimate is the standard one for dense decoder transformers (Kaplan et al. 2020, PaLM's
MFU): a forward pass costs about ``2 * N * T`` FLOPs for ``N`` parameters over ``T`` tokens,
a backward pass twice that, so a train pass (forward + backward) costs ``6 * N * T``. The
attention's quadratic term (``~12 * layers * hidden * seq`` per token) is left out, as are
the optimizer and the value head; the estimate is a slight undercount for long sequences.

For one policy-gradient train step over ``T`` batch tokens (prompt + response of every
sample, the whole batch, all ranks together) with ``E = learner.update.epochs``:

    FLOPs = N * T * (6 * E * (1 + critic)          actor (and critic) updates: every sample
                                                   passes forward + backward once per epoch
                     + 2 * (old + ref + critic))   extra forwards without grad: old
                                                   log-probs, reference log-probs, values

where ``old``, ``ref``, ``critic`` are 1 when the step runs that forward (``precompute``), else
0. The critic is the actor's backbone plus a scalar head, so it counts as ``N`` too.

MFU = FLOPs / (seconds * peak FLOP/s of one device * number of devices). The peak comes from
``learner.peak_tflops`` or, on CUDA, from ``PEAK_TFLOPS`` by device name; a CPU's peak depends
on its cores, vector width and clock, so it has no default: MFU is then unknown (None).

Pure: no torch, no devices; the worker supplies the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("H800", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
)
"""Dense bf16 tensor-core peak TFLOP/s per device (vendor data sheets, without sparsity), by
a substring of ``torch.cuda.get_device_name()``; the first match wins (specific names first:
"L40S" before "L4")."""


@dataclass(frozen=True)
class StepPasses:
    """How often one train step runs the model over every token of the batch."""

    num_train_passes: int
    """Forward + backward passes (6 FLOPs per parameter and token)."""
    num_extra_forwards: int
    """Forward passes without grad (2 FLOPs per parameter and token)."""


def peak_tflops_for(device_name: str) -> float | None:
    """The table's peak for a CUDA device name ("NVIDIA H200"); None when it is not listed."""
    for key, tflops in PEAK_TFLOPS:
        if key in device_name:
            return tflops
    return None


def policy_gradient_passes(
    ppo_epochs: int, has_critic: bool, old_logprobs: bool, reference: bool
) -> StepPasses:
    """The passes of one policy-gradient step (see the module doc for what each one is)."""
    return StepPasses(
        num_train_passes=ppo_epochs * (2 if has_critic else 1),
        num_extra_forwards=int(old_logprobs) + int(reference) + int(has_critic),
    )


def step_flops(num_params: int, num_tokens: int, passes: StepPasses) -> float:
    """``N * T * (6 * train passes + 2 * extra forwards)``."""
    per_token = 6 * passes.num_train_passes + 2 * passes.num_extra_forwards
    return float(num_params) * num_tokens * per_token


def mfu(flops: float, seconds: float, peak_tflops: float, num_devices: int) -> float:
    """Achieved FLOP/s over the devices' peak: ``flops / (seconds * peak * devices)``."""
    return flops / (seconds * peak_tflops * 1e12 * num_devices)


def utilisation_metrics(
    num_tokens: int,
    seconds: float,
    num_devices: int,
    flops: float | None,
    peak_tflops: float | None,
) -> dict[str, float]:
    """``perf/tokens_per_s_per_device`` and, when the FLOPs and the peak are known,
    ``perf/mfu`` (absent otherwise: the coordinator's summary then says why)."""
    out = {"perf/tokens_per_s_per_device": num_tokens / seconds / num_devices}
    if flops is not None and peak_tflops is not None:
        out["perf/mfu"] = mfu(flops, seconds, peak_tflops, num_devices)
    return out
