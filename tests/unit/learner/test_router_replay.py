"""Router replay (R3) on transformers' Qwen3-MoE: replaying the model's own routing changes
nothing; replaying other experts routes every token there, with the learner's own softmax
weights over the chosen experts (so the router still learns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hybridflow.models.router_replay import moe_routers, replay_routing
from tests.family_checkpoints import build_family_checkpoint
from tests.helpers import learner_config


def _own_routing(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """[tokens, layers, top_k] of the experts the model itself picks."""
    routers = moe_routers(model)
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        r.register_forward_hook(lambda m, i, out, li=li: seen.__setitem__(li, out[2]))
        for li, r in routers.items()
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    routed = torch.zeros(ids.shape[1], len(routers), 2, dtype=torch.long)
    for j, li in enumerate(routers):  # MoE layers in model order
        routed[:, j] = seen[li]
    return routed


def test_replaying_own_routing_is_exact_and_other_routing_is_followed(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    path = build_family_checkpoint(tmp_path, "qwen3_moe", False, mlp_only_layers=[0])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert sorted(moe_routers(model)) == [1]
    ids = torch.tensor([[5, 9, 30, 31, 60, 17, 4]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    own = _own_routing(model, ids)
    with torch.no_grad(), replay_routing(model, own):
        assert torch.equal(model(input_ids=ids).logits, plain)
    other = own.clone()
    other[:, 0] = (own[:, 0] + 1) % 4  # every token to other experts
    with torch.no_grad(), replay_routing(model, other):
        replayed = model(input_ids=ids).logits
    assert (replayed - plain).abs().max() > 1e-3
    assert torch.equal(_own_routing(model, ids), own)  # the replay ended with the block
    with torch.no_grad(), replay_routing(model, other[:3]):  # shorter: the rest is the model's
        partial = model(input_ids=ids).logits
    torch.testing.assert_close(partial[0, :3], replayed[0, :3])


def test_a_padded_batch_replays_each_row_and_leaves_the_rest_to_the_router(
    tmp_path: Path,
) -> None:
    """The learner's layout (``batch_routing`` over right-padded rows): replaying each row's
    own routing changes nothing; other experts for one row move only that row."""
    from transformers import AutoModelForCausalLM

    from hybridflow.models.router_replay import batch_routing
    from hybridflow.services.learner.batching import build_padded_batch
    from hybridflow.services.learner.forward import policy_forward

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        build_family_checkpoint(tmp_path, "qwen3_moe", False), dtype=torch.float32
    ).eval()
    prompts, responses = [[5, 9, 30], [31, 60]], [[17, 4, 8], [9]]
    batch = build_padded_batch(prompts, responses, 0, torch.device("cpu"))
    own = [
        _own_routing(model, torch.tensor([p + r]))[: len(p) + len(r) - 1].numpy()
        for p, r in zip(prompts, responses)
    ]
    with torch.no_grad():
        plain, _ = policy_forward(model, batch, 1.0, with_entropy=False)
        batch.routed_experts = batch_routing(own, batch.input_ids.shape[1], torch.device("cpu"))
        same, _ = policy_forward(model, batch, 1.0, with_entropy=False)
        torch.testing.assert_close(same, plain, rtol=0, atol=1e-6)
        moved = [own[0], (own[1] + 1) % 4]
        batch.routed_experts = batch_routing(moved, batch.input_ids.shape[1], torch.device("cpu"))
        other, _ = policy_forward(model, batch, 1.0, with_entropy=False)
    torch.testing.assert_close(other[0], plain[0], rtol=0, atol=1e-6)
    assert (other[1, :1] - plain[1, :1]).abs().max() > 1e-4


def test_the_learner_refuses_routing_it_cannot_replay(tmp_path: Path, make_samples) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from hybridflow.services.learner.worker import LearnerWorker

    config = learner_config(update={"micro_batch_size": 4}, moe_router_replay=True)
    dense = build_family_checkpoint(tmp_path / "dense", "qwen3", False)
    with pytest.raises(ValueError, match="no mixture-of-experts layers"):
        LearnerWorker(config, dense)
    worker = LearnerWorker(config, build_family_checkpoint(tmp_path / "moe", "qwen3_moe", False))
    samples = make_samples([1.0, 0.0])
    with pytest.raises(ValueError, match=r"samples\[0\].routed_experts: missing"):
        worker.train_step(samples)
    for s in samples:
        s.routed_experts = np.zeros((len(s.prompt_ids) + len(s.response_ids) - 1, 2, 2), np.int16)
    samples[1].routed_experts = samples[1].routed_experts[:, :1]
    with pytest.raises(ValueError, match=r"samples\[1\].routed_experts: routing has shape"):
        worker.train_step(samples)
    samples[1].routed_experts = np.full_like(samples[0].routed_experts[:2], 7)
    with pytest.raises(ValueError, match=r"samples\[1\].routed_experts: routing of 2 tokens"):
        worker.train_step(samples)
    assert worker.policy_version == 0


def test_a_train_step_replays_the_routing_it_is_sent(tmp_path: Path, make_samples) -> None:  # type: ignore[no-untyped-def]
    """The same batch, once routed as the model itself would and once to other experts:
    the first step equals a step without replay, the second differs."""
    from hybridflow.services.learner.worker import LearnerWorker

    path = build_family_checkpoint(tmp_path / "moe", "qwen3_moe", False)
    after: dict[str, torch.Tensor] = {}
    for mode in ("none", "own", "other"):
        worker = LearnerWorker(
            learner_config(update={"micro_batch_size": 4}, moe_router_replay=mode != "none"), path
        )
        samples = make_samples([1.0, 0.0, 0.0, 1.0])
        for s in samples:
            ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)])
            own = _own_routing(worker.actor, ids)[:-1].numpy().astype(np.int16)
            s.routed_experts = own if mode == "own" else (own + 1) % 4
        worker.train_step(samples)
        after[mode] = torch.cat([p.detach().flatten() for p in worker.actor.parameters()])
    torch.testing.assert_close(after["own"], after["none"], rtol=0, atol=1e-7)
    assert (after["other"] - after["none"]).abs().max() > 1e-5
