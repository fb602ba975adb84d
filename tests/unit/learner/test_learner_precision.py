"""``learner.memory``'s dtype, activation checkpointing and CPU offload in a single process
(``precision.py``; FSDP2 over 2 ranks: tests/integration/test_fsdp_memory.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from hybridflow.services.learner.precision import check_memory_config
from hybridflow.services.learner.train_state import save_train_state
from hybridflow.services.learner.worker import LearnerWorker
from tests.helpers import learner_config

BASE: dict[str, Any] = {
    "algorithm": "grpo",
    "optimizer": {"lr": 1e-3},
    "update": {"micro_batch_size": 2},
    "kl": {"use_reference": True, "coef": 0.05},
    "loss": {"entropy_coef": 0.01},
}
REWARDS = [1.0, 0.0, 0.5, 1.0, 0.0, 0.2]


def _worker(path: Path, **memory: Any) -> LearnerWorker:
    return LearnerWorker(learner_config(BASE, memory=LearnerMemoryConfig(**memory)), path)


def _step(worker: LearnerWorker, samples: list[Any]) -> dict[str, Any]:
    """compute_logprobs, then a train step recording the gradients, the dtypes its linears
    compute in and the bytes saved for the backward (in the decoder layers, in all)."""
    actor: Any = worker.actor
    seen: dict[str, Any] = {"linear": set(), "saved": 0, "in_layers": 0}
    inside = [0]
    # a decoder layer's linear (the head's forward is swapped for one that returns log-probs,
    # in float32, whatever it computed in: forward.py)
    probe = actor.model.layers[-1].mlp.down_proj
    handles = [probe.register_forward_hook(lambda m, i, o: seen["linear"].add(o.dtype))]
    for layer in actor.model.layers:
        handles.append(layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, 1)))
        handles.append(layer.register_forward_hook(lambda *_: inside.__setitem__(0, 0)))

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen["saved"] += t.numel() * t.element_size()
        seen["in_layers"] += t.numel() * t.element_size() * inside[0]
        return t

    grads: dict[str, torch.Tensor] = {}
    step = worker.actor_optim.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        grads.update({n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    worker.actor_optim.step = recording_step  # type: ignore[method-assign]
    logprobs = worker.compute_logprobs(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0
    )
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        metrics = worker.train_step(samples).metrics
    worker.actor_optim.step = step  # type: ignore[method-assign]
    for handle in handles:
        handle.remove()
    return {
        "logprobs": logprobs,
        "metrics": metrics,
        "grads": grads,
        "seen": seen,
        "weights": {k: v.clone() for k, v in actor.state_dict().items()},
    }


@pytest.fixture(scope="module")
def default_step(tiny_checkpoint: Path) -> dict[str, Any]:
    from tests.unit.learner.conftest import _make_samples

    return _step(_worker(tiny_checkpoint), _make_samples(REWARDS))


def test_bf16_computes_in_bf16_on_fp32_master_weights(
    tiny_checkpoint: Path, make_samples: Any, default_step: dict[str, Any]
) -> None:
    worker = _worker(tiny_checkpoint, dtype="bfloat16")
    got = _step(worker, make_samples(REWARDS))
    assert got["seen"]["linear"] == {torch.bfloat16}
    assert default_step["seen"]["linear"] == {torch.float32}
    assert {p.dtype for p in worker.actor.parameters()} == {torch.float32}
    assert {g.dtype for g in got["grads"].values()} == {torch.float32}
    assert len(got["grads"]) == len(list(worker.actor.parameters()))
    states = [v for s in worker.actor_optim.state.values() for k, v in s.items() if k != "step"]
    assert states and {v.dtype for v in states} == {torch.float32}
    # The reference runs as the actor does (fp32 parameters, bf16 autocast): KL 0 at step 0.
    assert worker.reference is not None
    assert {p.dtype for p in worker.reference.parameters()} == {torch.float32}
    assert got["metrics"]["actor/kl_loss"] == 0.0
    # Measured here: log-probs max |d| 0.04, mean 0.015; grad norm and entropy within 0.3 %.
    diffs = [abs(a - b) for a, b in zip(got["logprobs"], default_step["logprobs"], strict=True)]
    assert 0 < max(float(d.max()) for d in diffs) < 0.15
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        want = default_step["metrics"][key]
        assert got["metrics"][key] == pytest.approx(want, rel=5e-2, abs=5e-3), key


def test_activation_checkpointing_equals_the_default_and_saves_less(
    tiny_checkpoint: Path, make_samples: Any, default_step: dict[str, Any]
) -> None:
    worker = _worker(tiny_checkpoint, activation_checkpointing=True)
    got = _step(worker, make_samples(REWARDS))
    for key, value in default_step["metrics"].items():
        assert got["metrics"][key] == pytest.approx(value, abs=1e-6, rel=0), key
    assert set(got["grads"]) == set(default_step["grads"])
    for name, grad in default_step["grads"].items():
        torch.testing.assert_close(got["grads"][name], grad, atol=1e-6, rtol=0)
    # Hugging Face names unchanged (the weight sync and the checkpoints use them).
    assert set(got["weights"]) == set(default_step["weights"])
    for name, tensor in default_step["weights"].items():
        torch.testing.assert_close(got["weights"][name], tensor, atol=1e-6, rtol=0)
    # Inside a layer only its input is kept (the layers' activations are recomputed).
    saved, saved_default = got["seen"], default_step["seen"]
    assert 0 < saved["in_layers"] * 10 < saved_default["in_layers"]
    assert saved["saved"] < saved_default["saved"]


def test_cpu_offload_on_a_cpu_process_changes_nothing(
    tiny_checkpoint: Path, make_samples: Any, default_step: dict[str, Any]
) -> None:
    got = _step(_worker(tiny_checkpoint, cpu_offload=True), make_samples(REWARDS))
    assert got["metrics"] == default_step["metrics"]
    for name, tensor in default_step["weights"].items():
        assert torch.equal(got["weights"][name], tensor), name


def test_cpu_offload_is_refused_on_a_single_cuda_process() -> None:
    memory = LearnerMemoryConfig(cpu_offload=True)
    with pytest.raises(ValueError, match=r"learner\.memory\.cpu_offload needs a sharded learner"):
        check_memory_config(memory, "cuda", sharded=False)
    check_memory_config(memory, "cuda", sharded=True)
    check_memory_config(memory, "cpu", sharded=False)


@pytest.mark.parametrize(("saved", "resumed"), [("bfloat16", "float32"), ("float32", "bfloat16")])
def test_a_train_state_resumes_across_dtypes(
    tiny_checkpoint: Path, make_samples: Any, tmp_path: Path, saved: str, resumed: str
) -> None:
    samples = make_samples(REWARDS)
    source = _worker(tiny_checkpoint, dtype=saved)
    source.train_step(samples)
    save_train_state(source, tmp_path / "state")
    target = _worker(tiny_checkpoint, dtype=resumed)
    assert target.load_train_state(tmp_path / "state") == 1
    want = source.actor.state_dict()
    for name, tensor in target.actor.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, want[name]), name
    for p, q in zip(source.actor.parameters(), target.actor.parameters(), strict=True):
        mine, theirs = source.actor_optim.state[p], target.actor_optim.state[q]
        for key in ("exp_avg", "exp_avg_sq"):
            assert theirs[key].dtype == torch.float32 and torch.equal(theirs[key], mine[key])
    assert target.train_step(samples).policy_version == 2


def test_the_critic_takes_checkpointing_and_bf16_too(
    tiny_checkpoint: Path, make_samples: Any
) -> None:
    def run(**memory: Any) -> dict[str, float]:
        cfg = learner_config(
            algorithm="ppo",
            optimizer={"lr": 1e-3},
            critic={"lr": 1e-3},
            memory=LearnerMemoryConfig(**memory),
        )
        return LearnerWorker(cfg, tiny_checkpoint).train_step(make_samples(REWARDS)).metrics

    default = run()
    checkpointed = run(activation_checkpointing=True)
    for key, value in default.items():
        assert checkpointed[key] == pytest.approx(value, abs=1e-6, rel=0), key
    bf16 = run(dtype="bfloat16")
    assert bf16["critic/vf_loss"] == pytest.approx(default["critic/vf_loss"], rel=5e-2)
    assert bf16["critic/vf_loss"] != default["critic/vf_loss"]
