"""The learner's memory tools (``learner.memory``): packing, token-budget micro-batches and
chunked log-probs compute what the default layout computes (log-probs, entropies, values,
losses and gradients within 1e-5 fp32), and each changes what a step holds in memory.

Memory is measured by the tensors the ops produce (a ``TorchDispatchMode`` records every
op's output shapes, forward, checkpoint recompute and backward): the largest tensor of a
given trailing size is a count that depends on the layout alone, so the checks below state
exact sizes and cannot pass by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoModelForCausalLM

from hybridflow.services.learner.batch_plans import (
    plan_step_micro_batches,
    plan_token_micro_batches,
)
from hybridflow.services.learner.batching import (
    PaddedBatch,
    build_batch,
    build_packed_batch,
    build_padded_batch,
)
from hybridflow.services.learner.forward import policy_forward, value_forward
from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from hybridflow.services.learner.models import load_critic
from hybridflow.services.learner.worker import LearnerWorker
from tests.family_checkpoints import build_family_checkpoint
from tests.helpers import learner_config

CPU = torch.device("cpu")
TOL = 1e-5
PROMPTS = [[5, 9, 30, 4], [31, 60], [7, 8, 9, 10, 11, 12, 13], [40, 41, 42]]
RESPONSES = [[17, 4, 8], [9], [12, 13, 14, 15, 16], [50, 51]]


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", False)


@pytest.fixture(params=["llama", "qwen3"])
def checkpoint(request: pytest.FixtureRequest, tiny_checkpoint: Path) -> Path:
    if request.param == "llama":
        return tiny_checkpoint
    path: Path = request.getfixturevalue("qwen3_checkpoint")
    return path


class _OpShapes(TorchDispatchMode):
    """Records the shape of every tensor any op returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                self.shapes.append(tuple(leaf.shape))
        return out

    def largest(self, last_dim: int, hidden: int) -> int:
        """Elements of the largest recorded activation whose last dim is ``last_dim`` (a
        ``[hidden, last_dim]`` tensor is a transposed weight or its gradient: skipped)."""
        sizes = [
            _numel(s) for s in self.shapes if s and s[-1] == last_dim and s != (hidden, last_dim)
        ]
        return max(sizes, default=0)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# ---------------------------------------------------------------- layouts and plans
def test_packed_batch_layout() -> None:
    # Row 0: prompt [5, 6] + response [7, 8, 9]; row 1: [5, 6, 7] + [8]: 9 tokens in one row.
    b = build_packed_batch([[5, 6], [5, 6, 7]], [[7, 8, 9], [8]], 0, CPU, [1.0, 0.0])
    padded = build_padded_batch([[5, 6], [5, 6, 7]], [[7, 8, 9], [8]], 0, CPU, [1.0, 0.0])
    assert b.packed and b.rows == 2
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 5, 6, 7, 8]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    # Response j of row 1 is predicted at 5 + 3 - 1 = 7; its padded slots clamp there too.
    assert b.response_index.tolist() == [[1, 2, 3], [7, 7, 7]]
    assert torch.equal(b.flat_response_index(), b.response_index)
    assert torch.equal(b.response_ids, padded.response_ids)
    assert torch.equal(b.response_mask, padded.response_mask)
    # The padded layout's flat index points at the same tokens of its flattened rows.
    flat = padded.input_ids.reshape(-1)[padded.flat_response_index() + 1]
    assert torch.equal(flat, b.input_ids.reshape(-1)[b.response_index + 1])
    assert not build_batch([[5]], [[6]], 0, CPU).packed


def test_token_budget_plan_fills_each_micro_batch_and_evens_out_the_ranks() -> None:
    lengths = [4, 5, 3, 12, 2, 2, 2, 2]
    slices = [[0, 1, 2, 3], [4, 5, 6, 7]]
    rank0 = plan_token_micro_batches(slices, 0, lengths, 10, filler_index=0)
    rank1 = plan_token_micro_batches(slices, 1, lengths, 10, filler_index=4)
    # 4 + 5 fit 10, 3 starts a new one, 12 is over the budget and goes alone.
    assert [m.indices for m in rank0] == [[0, 1], [2], [3]]
    assert [m.indices for m in rank1] == [[4, 5, 6, 7], [4], [4]]
    assert [m.weights for m in rank1] == [[1.0] * 4, [0.0], [0.0]]
    assert rank1[1] is not rank1[2]
    # Budget 0: the row plan.
    rows = plan_step_micro_batches(slices, 0, 3, 0, lengths, max_tokens=0)
    assert [m.indices for m in rows] == [[0, 1, 2], [3]]
    with pytest.raises(ValueError, match="max_tokens"):
        plan_token_micro_batches(slices, 0, lengths, 0, 0)


# ---------------------------------------------------------------- forward equality
def _policy_run(
    model: torch.nn.Module, batch: PaddedBatch, chunk: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Masked log-probs and entropies, a token-mean loss of both, and the parameter grads."""
    model.zero_grad(set_to_none=True)
    logp, entropy = policy_forward(model, batch, 0.7, with_entropy=True, chunk_tokens=chunk)
    assert entropy is not None
    mask = batch.response_mask
    loss = -((logp + 0.1 * entropy) * mask).sum() / mask.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return (logp * mask).detach(), (entropy * mask).detach(), loss.detach(), grads


@pytest.mark.parametrize(
    ("packed", "chunk"), [(False, 0), (True, 0), (False, 3), (True, 2), (False, 1000)]
)
def test_packed_and_chunked_policy_forward_match_the_padded_whole_one(
    checkpoint: Path, packed: bool, chunk: int
) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    weights = [1.0, 1.0, 0.0, 1.0]  # a filler row too
    # the model's own forward: every position's logits (learner.memory.full_logits)
    want = _policy_run(model, build_padded_batch(PROMPTS, RESPONSES, 0, CPU, weights), None)
    got = _policy_run(model, build_batch(PROMPTS, RESPONSES, 0, CPU, weights, packed), chunk)
    for name, a, b in zip(("logp", "entropy", "loss"), got[:3], want[:3], strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=name)
    assert set(got[3]) == set(want[3]) and want[3]
    for name, grad in want[3].items():
        torch.testing.assert_close(got[3][name], grad, atol=TOL, rtol=0, msg=name)
    assert float(want[2].abs()) > 0.1  # the loss says something
    # Without grad (precompute, compute_logprobs) the chunks run plainly: same values.
    with torch.no_grad():
        batch = build_batch(PROMPTS, RESPONSES, 0, CPU, weights, packed)
        logp, entropy = policy_forward(model, batch, 0.7, with_entropy=False, chunk_tokens=chunk)
    assert entropy is None
    torch.testing.assert_close(logp * batch.response_mask, want[0], atol=TOL, rtol=0)
    assert "forward" not in vars(model.get_output_embeddings())  # the head is restored


def test_packed_values_match_padded(checkpoint: Path) -> None:
    critic = load_critic(checkpoint, CPU, seed=0)
    out = {}
    for packed in (False, True):
        critic.zero_grad(set_to_none=True)
        batch = build_batch(PROMPTS, RESPONSES, 0, CPU, None, packed)
        values = value_forward(critic, batch) * batch.response_mask
        (values.square().sum() / batch.response_mask.sum()).backward()
        grads = {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}
        out[packed] = (values.detach(), grads)
    torch.testing.assert_close(out[True][0], out[False][0], atol=TOL, rtol=0)
    for name, grad in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], grad, atol=TOL, rtol=0, msg=name)


def test_packed_router_replay_matches_padded_replay(tmp_path: Path) -> None:
    """Each sequence's routing sits at its own tokens of the packed row (``UpdateContext``'s
    layout): replaying other experts moves the packed log-probs as it moves the padded ones."""
    from hybridflow.models.router_replay import batch_routing, moe_routers

    model = AutoModelForCausalLM.from_pretrained(
        build_family_checkpoint(tmp_path, "qwen3_moe", False), dtype=torch.float32
    ).eval()
    layers = len(moe_routers(model))
    gen = torch.Generator().manual_seed(0)
    routed = [
        torch.randint(0, 4, (len(p) + len(r) - 1, layers, 2), generator=gen).numpy()
        for p, r in zip(PROMPTS, RESPONSES, strict=True)
    ]
    for r in routed:  # top-k picks distinct experts
        r[..., 1] = (r[..., 0] + 1 + r[..., 1] % 3) % 4
    padded = build_padded_batch(PROMPTS, RESPONSES, 0, CPU)
    padded.routed_experts = batch_routing(routed, padded.input_ids.shape[1], CPU)
    packed = build_packed_batch(PROMPTS, RESPONSES, 0, CPU)
    packed.routed_experts = torch.cat(
        [
            batch_routing([r], len(p) + len(s), CPU)
            for r, p, s in zip(routed, PROMPTS, RESPONSES, strict=True)
        ]
    )
    with torch.no_grad():
        own = policy_forward(model, build_padded_batch(PROMPTS, RESPONSES, 0, CPU), 1.0, False)[0]
        want = policy_forward(model, padded, 1.0, False)[0] * padded.response_mask
        got = policy_forward(model, packed, 1.0, False, chunk_tokens=4)[0] * packed.response_mask
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert float(((own * padded.response_mask) - want).abs().max()) > 1e-4  # replay mattered


# ---------------------------------------------------------------- the worker
def _worker(path: Path, memory: LearnerMemoryConfig | None = None, **keys: Any) -> LearnerWorker:
    base = {"optimizer": {"lr": 1e-3, "weight_decay": 0.0}, "update": {"micro_batch_size": 4}}
    config = learner_config(base, keys, memory=memory or LearnerMemoryConfig())
    return LearnerWorker(config, path)


def _params(worker: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.full_state_dict_items()}


ALL_TOOLS = LearnerMemoryConfig(packing=True, max_tokens_per_micro_batch=9, logprob_chunk_tokens=3)


@pytest.mark.parametrize(
    "memory",
    [
        LearnerMemoryConfig(packing=True),
        LearnerMemoryConfig(logprob_chunk_tokens=2),
        LearnerMemoryConfig(max_tokens_per_micro_batch=9),
        ALL_TOOLS,
    ],
    ids=["packing", "chunked", "token_budget", "all"],
)
def test_ppo_step_and_logprobs_with_memory_tools_match_the_default(
    tiny_checkpoint: Path, make_samples: Callable[..., Any], memory: LearnerMemoryConfig
) -> None:
    """PPO with a critic, a KL-loss reference and two epochs (old log-probs from precompute):
    every metric, the log-probs served and the weights after the step."""
    samples = make_samples([1.0, 0.0, 0.3, 0.9, 0.5, 0.0, 0.2])
    fields = {
        "algorithm": "ppo",
        "update": {"epochs": 2},
        "kl": {"use_reference": True, "coef": 0.05},
        "loss": {"entropy_coef": 0.01},
    }
    plain, tools = _worker(tiny_checkpoint, **fields), _worker(tiny_checkpoint, memory, **fields)
    m_plain, m_tools = plain.train_step(samples).metrics, tools.train_step(samples).metrics
    assert set(m_tools) == set(m_plain)
    for key, value in m_plain.items():
        assert m_tools[key] == pytest.approx(value, abs=TOL, rel=TOL), key
    assert m_plain["critic/vf_loss"] > 0 and m_plain["actor/kl_loss"] > 0
    for key, tensor in _params(plain).items():
        torch.testing.assert_close(_params(tools)[key], tensor, atol=TOL, rtol=0, msg=key)
    prompts, responses = [s.prompt_ids for s in samples], [s.response_ids for s in samples]
    for got, want in zip(
        tools.compute_logprobs(prompts, responses, 1.0),
        plain.compute_logprobs(prompts, responses, 1.0),
        strict=True,
    ):
        assert got == pytest.approx(want, abs=TOL)


def test_dpo_step_with_memory_tools_matches_the_default(tiny_checkpoint: Path) -> None:
    from hybridflow.data.preference import read_preference_dataset
    from hybridflow.preference.config import PreferenceConfig

    # lr as in the RL tests: Adam's first steps move every weight by about lr, whatever the
    # size of its gradient, so gradients that agree to 1e-7 give weights that agree to lr/1e3.
    plain = _worker(tiny_checkpoint, kl={"use_reference": True})
    tools = _worker(tiny_checkpoint, ALL_TOOLS, kl={"use_reference": True})
    records = read_preference_dataset("builtin:arith_dpo", plain.tokenizer, "dpo", num=6)
    for _ in range(2):  # the second step starts from a policy away from the reference
        m_plain = plain.preference_step(records, PreferenceConfig(loss="dpo"))
        m_tools = tools.preference_step(records, PreferenceConfig(loss="dpo"))
        for key, value in m_plain.items():
            assert m_tools[key] == pytest.approx(value, abs=TOL, rel=TOL), key
    for key, tensor in _params(plain).items():
        torch.testing.assert_close(_params(tools)[key], tensor, atol=TOL, rtol=0, msg=key)


# ---------------------------------------------------------------- memory
def _forward_backward(model: torch.nn.Module, batch: PaddedBatch, chunk: int | None) -> _OpShapes:
    with _OpShapes() as shapes:
        logp, entropy = policy_forward(model, batch, 1.0, with_entropy=True, chunk_tokens=chunk)
        assert entropy is not None
        ((logp + entropy) * batch.response_mask).sum().backward()
    return shapes


def test_chunked_logprobs_never_hold_more_than_a_chunk_of_logits(tiny_checkpoint: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    batch = build_padded_batch(PROMPTS, RESPONSES, 0, CPU)
    rows, seq = batch.input_ids.shape
    whole = _forward_backward(model, batch, None)
    assert whole.largest(vocab, hidden) == rows * seq * vocab  # full_logits: every position's
    response_only = _forward_backward(model, batch, 0)  # the default: the response positions'
    assert response_only.largest(vocab, hidden) == batch.response_ids.numel() * vocab
    for chunk in (1, 3):
        chunked = _forward_backward(model, batch, chunk)
        assert chunked.largest(vocab, hidden) == chunk * vocab, chunk
        # Forward and backward (the recompute) both ran chunk by chunk.
        assert sum(1 for s in chunked.shapes if s == (chunk, vocab)) > 2 * (
            batch.response_ids.numel() // chunk
        )


def test_packing_computes_no_padded_positions(tiny_checkpoint: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    inner = model.config.intermediate_size  # the MLP's activations: [.., tokens, inner]
    hidden = model.config.hidden_size
    tokens = [len(p) + len(r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    padded = _forward_backward(model, build_padded_batch(PROMPTS, RESPONSES, 0, CPU), 0)
    packed = _forward_backward(model, build_packed_batch(PROMPTS, RESPONSES, 0, CPU), 0)
    assert padded.largest(inner, hidden) == len(tokens) * max(tokens) * inner
    assert packed.largest(inner, hidden) == sum(tokens) * inner < padded.largest(inner, hidden)


def test_token_budget_bounds_the_micro_batches_of_a_step(
    tiny_checkpoint: Path, make_samples: Callable[..., Any]
) -> None:
    """A step's largest activation: ``micro_batch_size`` rows of the longest sample, or, with
    packing and a budget, the largest group of consecutive samples within the budget."""
    samples = make_samples([1.0, 0.0, 0.3, 0.9, 0.5, 0.0, 0.2, 0.4])
    tokens = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    budget = 12
    sizes = {}
    for name, memory in (
        ("rows", LearnerMemoryConfig()),
        ("budget", LearnerMemoryConfig(packing=True, max_tokens_per_micro_batch=budget)),
    ):
        worker = _worker(tiny_checkpoint, memory, update={"micro_batch_size": 8})
        inner = worker.actor.config.intermediate_size
        with _OpShapes() as shapes:
            worker.train_step(samples)
        sizes[name] = shapes.largest(inner, worker.actor.config.hidden_size) // inner
    groups = plan_token_micro_batches([list(range(len(samples)))], 0, tokens, budget, 0)
    assert sizes["rows"] == len(samples) * max(tokens)
    assert sizes["budget"] == max(sum(tokens[i] for i in g.indices) for g in groups) <= budget


def test_chunking_refuses_logits_soft_capped_after_the_head(tmp_path: Path) -> None:
    from hybridflow.services.learner.forward import output_head

    gemma2 = AutoModelForCausalLM.from_pretrained(
        build_family_checkpoint(tmp_path, "gemma2", False), dtype=torch.float32
    )
    assert gemma2.config.final_logit_softcapping is not None
    with pytest.raises(ValueError, match="soft-caps its logits"):
        output_head(gemma2)
    with pytest.raises(ValueError, match="soft-caps its logits"):
        _worker(tmp_path, LearnerMemoryConfig(logprob_chunk_tokens=4))
    # by default such a model runs its own forward (every position's logits, capped): the same
    # log-probs as full_logits, the head left alone
    batch = build_padded_batch(PROMPTS, RESPONSES, 0, CPU)
    with torch.no_grad():
        default = policy_forward(gemma2, batch, 1.0, False)[0]
        full = policy_forward(gemma2, batch, 1.0, False, chunk_tokens=None)[0]
    torch.testing.assert_close(default * batch.response_mask, full * batch.response_mask)
    assert "forward" not in vars(gemma2.get_output_embeddings())


def test_full_logits_and_chunks_are_one_choice() -> None:
    assert LearnerMemoryConfig().head_chunk == 0
    assert LearnerMemoryConfig(full_logits=True).head_chunk is None
    assert LearnerMemoryConfig(logprob_chunk_tokens=8).head_chunk == 8
    with pytest.raises(ValueError, match="set one"):
        LearnerMemoryConfig(full_logits=True, logprob_chunk_tokens=8).validate()
