"""``learner.memory``'s dtype, activation checkpointing and CPU offload on FSDP2 over 2 gloo
ranks (``hybridflow/services/learner/precision.py``).

One spawn runs a GRPO step (reference, KL loss, entropy, micro-batches of 2) under each
setting and records what rank 0 saw; the test compares them with the default:
- bf16: sharded parameters, their gradients and AdamW's state stay float32 DTensors (also
  after a forward without backward: what the weight sync and the train state read), the
  decoder layers compute in bf16, the reference is held in bf16 and equals the actor's
  compute at step 0 (KL 0), log-probs and loss close to fp32 (the measured tolerance);
- activation checkpointing: loss, gradients and weights after the step equal the default's
  within 1e-6, and a decoder layer saves only its input for the backward (bytes counted
  with ``saved_tensors_hooks``);
- CPU offload (CPU-only: nothing to move): runs, equal to the default;
- a train state saved in bf16 resumes in fp32 and one saved in fp32 resumes in bf16, exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from tests.helpers import build_tiny_checkpoint, learner_config
from tests.integration.test_fsdp_parity import _free_port, _join_group, _leave_group, _spawn
from tests.unit.learner.conftest import _make_samples

pytestmark = pytest.mark.slow

BASE: dict[str, Any] = {
    "algorithm": "grpo",
    "optimizer": {"lr": 1e-3},
    "update": {"micro_batch_size": 2},
    "kl": {"use_reference": True, "coef": 0.05},
    "loss": {"entropy_coef": 0.01},
}
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "bf16": {"dtype": "bfloat16"},
    "ac": {"activation_checkpointing": True},
    "offload": {"cpu_offload": True},
}
REWARDS = [1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.2]  # 7 samples: rank slices of 4 and 3


def _config(memory: dict[str, Any]) -> LearnerConfig:
    return learner_config(BASE, memory=LearnerMemoryConfig(**memory))


def _run_case(worker: Any, samples: list[Any]) -> dict[str, Any]:
    """One step on this rank, instrumented (see the module doc); what it saw."""
    from torch.distributed.tensor import DTensor

    actor = worker.actor
    seen: dict[str, Any] = {
        "layer_dtypes": set(),
        "saved_in_layers": 0,
        "saved": 0,
        "layer_inputs": 0,
    }
    inside = [0]

    def enter(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        inside[0] += 1
        if torch.is_grad_enabled():
            hidden = args[0] if args else kwargs["hidden_states"]
            seen["layer_inputs"] += hidden.numel() * hidden.element_size()

    def leave(_m: Any, _i: Any, out: Any) -> None:
        inside[0] -= 1
        seen["layer_dtypes"].add(str((out[0] if isinstance(out, tuple) else out).dtype))

    handles = []
    for layer in actor.model.layers:
        handles.append(layer.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(layer.register_forward_hook(leave))

    def pack(t: torch.Tensor) -> torch.Tensor:
        size = t.numel() * t.element_size()
        seen["saved"] += size
        if inside[0]:
            seen["saved_in_layers"] += size
        return t

    grads: dict[str, torch.Tensor] = {}
    step = worker.actor_optim.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        for name, p in actor.named_parameters():
            assert isinstance(p, DTensor) and p.grad is not None
            grads[name] = p.grad.to_local().clone()
            seen.setdefault("grad_dtypes", set()).add(str(p.grad.dtype))
        return step(*args, **kwargs)

    worker.actor_optim.step = recording_step
    prompts = [s.prompt_ids for s in samples]
    responses = [s.response_ids for s in samples]
    logprobs = worker.compute_logprobs(prompts, responses, 1.0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = worker.train_step(samples)
    worker.actor_optim.step = step
    for handle in handles:
        handle.remove()
    worker.compute_logprobs(prompts, responses, 1.0)  # a forward without backward, last
    seen["params"] = {(type(p).__name__, str(p.dtype), p.device.type) for p in actor.parameters()}
    seen["reference"] = {str(p.dtype) for p in worker.reference.parameters()}
    seen["optim"] = {
        str(v.dtype)
        for state in worker.actor_optim.state.values()
        for k, v in state.items()
        if k != "step"
    }
    seen["layer_dtypes"] = sorted(seen["layer_dtypes"])
    seen["grad_dtypes"] = sorted(seen.get("grad_dtypes", ()))
    return {
        "seen": seen,
        "logprobs": logprobs,
        "metrics": result.metrics,
        "grads": grads,
        "weights": {k: v.clone() for k, v in worker.full_state_dict_items()},
    }


def _rank_main(rank: int, port: int, ckpt: str, out_dir: str) -> None:
    _join_group(rank, port)
    from hybridflow.services.learner.train_state import save_train_state
    from hybridflow.services.learner.worker import LearnerWorker

    samples = _make_samples(REWARDS, group_size=3)
    out: dict[str, Any] = {}
    for name, memory in CASES.items():
        worker = LearnerWorker(_config(memory), ckpt)
        out[name] = _run_case(worker, samples)
        if name in ("default", "bf16"):
            save_train_state(worker, Path(out_dir) / f"state-{name}")
    # Across dtypes: fp32 resumes a bf16 run's train state, bf16 an fp32 run's.
    for saved, memory in (("bf16", {}), ("default", {"dtype": "bfloat16"})):
        worker = LearnerWorker(_config(memory), ckpt)
        version = worker.load_train_state(Path(out_dir) / f"state-{saved}")
        out[f"resumed-{saved}"] = {
            "version": version,
            "weights": {k: v.clone() for k, v in worker.full_state_dict_items()},
            "optim": {str(v.dtype) for s in worker.actor_optim.state.values() for v in s.values()},
            "metrics": worker.train_step(samples).metrics,  # and it trains on
        }
    if rank == 0:
        torch.save(out, Path(out_dir) / "memory.pt")
    _leave_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("fsdp_memory")
    ckpt = build_tiny_checkpoint(tmp / "tiny")
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp)))
    out: dict[str, Any] = torch.load(tmp / "memory.pt", weights_only=False)
    out["dir"] = tmp
    return out


def _max_abs(a: list[Any], b: list[Any]) -> float:
    return max(float(abs(x - y).max()) for x, y in zip(a, b, strict=True))


def test_bf16_computes_in_bf16_and_keeps_fp32_master_state(ranks: dict[str, Any]) -> None:
    default, bf16 = ranks["default"], ranks["bf16"]
    assert bf16["seen"]["layer_dtypes"] == ["torch.bfloat16"]
    assert default["seen"]["layer_dtypes"] == ["torch.float32"]
    # Sharded fp32 parameters on CPU, also after a forward without backward (the root too).
    assert bf16["seen"]["params"] == {("DTensor", "torch.float32", "cpu")}
    assert bf16["seen"]["grad_dtypes"] == ["torch.float32"]
    assert bf16["seen"]["optim"] == {"torch.float32"}
    assert bf16["seen"]["reference"] == {"torch.bfloat16"}
    assert default["seen"]["reference"] == {"torch.float32"}
    assert all(t.dtype == torch.float32 for t in bf16["weights"].values())
    # The bf16 reference is what the actor's bf16 compute sees: no KL before the update.
    assert bf16["metrics"]["actor/kl_loss"] == 0.0
    # Measured on this model: log-probs max |d| ~0.03, the loss agrees to ~1e-3.
    assert _max_abs(bf16["logprobs"], default["logprobs"]) < 0.15
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        want = default["metrics"][key]
        assert bf16["metrics"][key] == pytest.approx(want, rel=5e-2, abs=5e-3), key
    assert bf16["metrics"]["actor/grad_norm"] != default["metrics"]["actor/grad_norm"]


def test_activation_checkpointing_changes_nothing_but_what_is_saved(
    ranks: dict[str, Any],
) -> None:
    default, ac = ranks["default"], ranks["ac"]
    for key, value in default["metrics"].items():
        assert ac["metrics"][key] == pytest.approx(value, abs=1e-6, rel=0), key
    for name, grad in default["grads"].items():
        torch.testing.assert_close(ac["grads"][name], grad, atol=1e-6, rtol=0)
    for name, tensor in default["weights"].items():
        torch.testing.assert_close(ac["weights"][name], tensor, atol=1e-6, rtol=0)
    # The layers' activations are recomputed, not kept: all a layer saves for the backward
    # is its input (the checkpoint's), a fraction of what it saves without.
    inputs = ac["seen"]["layer_inputs"]
    assert inputs > 0 and inputs == default["seen"]["layer_inputs"]
    assert ac["seen"]["saved_in_layers"] == inputs
    assert default["seen"]["saved_in_layers"] > 10 * inputs
    outside = default["seen"]["saved"] - default["seen"]["saved_in_layers"]
    assert ac["seen"]["saved"] == outside + inputs


def test_cpu_offload_runs_and_changes_nothing_on_a_cpu_learner(ranks: dict[str, Any]) -> None:
    default, offload = ranks["default"], ranks["offload"]
    assert offload["seen"]["params"] == {("DTensor", "torch.float32", "cpu")}
    for key, value in default["metrics"].items():
        assert offload["metrics"][key] == pytest.approx(value, abs=1e-6, rel=0), key
    for name, tensor in default["weights"].items():
        torch.testing.assert_close(offload["weights"][name], tensor, atol=1e-6, rtol=0)


def test_a_train_state_resumes_across_dtypes(ranks: dict[str, Any]) -> None:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for saved in ("bf16", "default"):
        meta = FileSystemReader(ranks["dir"] / f"state-{saved}" / "dcp").read_metadata()
        dtypes = {
            e.properties.dtype
            for e in meta.state_dict_metadata.values()
            if isinstance(e, TensorStorageMetadata) and e.size  # not the scalar steps
        }
        assert dtypes == {torch.float32}, saved
        resumed = ranks[f"resumed-{saved}"]
        assert resumed["version"] == 1
        assert {"torch.float32"} <= resumed["optim"]
        for name, tensor in ranks[saved]["weights"].items():
            assert torch.equal(resumed["weights"][name], tensor), (saved, name)
        assert resumed["metrics"]["training/policy_version"] == 2.0
