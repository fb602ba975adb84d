"""Shared prompts (``learner.memory.shared_prompts``): a micro-batch's samples with one prompt
run it once, in one row with a 4-D attention mask. The log-probs, entropies, values, gradients
and a whole PPO step must equal the padded layout's (within fp32 rounding) for every family
and both attention implementations that take such a mask, and the model must really see fewer
tokens; where the mask cannot apply (a flash kernel, a sequence past a sliding window, packing,
router replay) the learner keeps one row per sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from hybridflow.services.learner.batching import (
    PaddedBatch,
    PromptSharing,
    build_batch,
    build_padded_batch,
    build_shared_batch,
)
from hybridflow.services.learner.forward import policy_forward, prompt_sharing, value_forward
from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from hybridflow.services.learner.models import load_critic
from hybridflow.services.learner.worker import LearnerWorker
from hybridflow.types import TrainSample
from tests.family_checkpoints import FAMILY_CONFIGS, build_family_checkpoint
from tests.helpers import learner_config

CPU = torch.device("cpu")
TOL = 1e-5
# Two groups of three and a lone prompt, interleaved; responses of uneven lengths.
PROMPTS = [[5, 9, 30, 4], [31, 60], [5, 9, 30, 4], [31, 60], [7, 8, 9], [5, 9, 30, 4], [31, 60]]
RESPONSES = [[17, 4, 8], [9], [12, 13, 14, 15, 16], [50, 51], [40], [3, 3], [22, 23, 24]]


def test_shared_batch_layout() -> None:
    b = build_shared_batch([[5, 6], [7], [5, 6]], [[8, 9], [10, 11, 12], [13]], 0, CPU)
    assert b.shared and b.rows == 3
    # one row per prompt, in first-seen order: [5, 6] + 8 9 + 13, and [7] + 10 11 12
    assert b.input_ids.tolist() == [[5, 6, 8, 9, 13], [7, 10, 11, 12, 0]]
    # each response continues its prompt's positions
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 3, 0]]
    # sample 0's tokens are predicted at 1 (the prompt's end) and 2; sample 2's at 1 (its pad
    # slots clamp to its own last token, flat 4); sample 1's at 5 + 0, 5 + 1, 5 + 2
    assert b.response_index.tolist() == [[1, 2, 3], [5, 6, 7], [1, 4, 4]]
    mask = b.attention_mask[:, 0].int().tolist()
    assert mask[0] == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # the second response sees the prompt and itself, not the first
    ]
    assert mask[1][4] == [0, 0, 0, 0, 1]  # padding sees only itself: no empty softmax row
    padded = build_padded_batch([[5, 6], [7], [5, 6]], [[8, 9], [10, 11, 12], [13]], 0, CPU)
    assert torch.equal(b.response_ids, padded.response_ids)
    assert torch.equal(b.response_mask, padded.response_mask)
    # every index points at the token before the response token it predicts
    flat = b.input_ids.reshape(-1)
    before = [flat[i].item() for i in b.response_index[:, 0]]
    assert before == [6, 7, 6]


WIDE = PromptSharing(max_len=1000, hidden_size=128)


def test_build_batch_shares_only_where_it_pays() -> None:
    assert build_batch(PROMPTS, RESPONSES, 0, CPU, sharing=WIDE).shared
    assert not build_batch(PROMPTS, RESPONSES, 0, CPU).shared  # None: off
    distinct = [[1, 2], [3, 4]]
    assert not build_batch(distinct, [[5], [6]], 0, CPU, sharing=WIDE).shared
    # a sequence longer than the bound (a sliding window): one row per sample
    window = PromptSharing(max_len=8, hidden_size=128)
    assert not build_batch(PROMPTS, RESPONSES, 0, CPU, sharing=window).shared
    packed = build_batch(PROMPTS, RESPONSES, 0, CPU, packed=True, sharing=WIDE)
    assert packed.packed and not packed.shared
    # a short prompt before long responses: one row of 8 x 400 tokens would hold 64 times
    # the attention pairs of 8 rows of 401 and save 7 positions: not shared
    long = [list(range(4, 404))] * 8
    assert not build_batch([[1]] * 8, long, 0, CPU, sharing=WIDE).shared
    assert WIDE.cost([3201]) > WIDE.cost([401] * 8)
    # the same responses after a long prompt: shared
    assert build_batch([list(range(4, 1000))] * 2, [[5]] * 2, 0, CPU, sharing=WIDE).shared


def _policy_run(model: nn.Module, batch: PaddedBatch) -> tuple[torch.Tensor, ...]:
    """Masked log-probs, entropies, a loss of both and every parameter's gradient, flat."""
    model.zero_grad(set_to_none=True)
    logp, entropy = policy_forward(model, batch, 0.7, with_entropy=True, chunk_tokens=0)
    assert entropy is not None
    mask = batch.response_mask
    loss = -((logp + 0.1 * entropy) * mask).sum() / mask.sum()
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return (logp * mask).detach(), (entropy * mask).detach(), loss.detach(), grads


CASES = [(family, "sdpa") for family in FAMILY_CONFIGS] + [
    ("llama", "eager"),
    ("gemma2", "eager"),
]


@pytest.mark.parametrize(("family", "attention"), CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_shared_forward_and_gradients_match_padded(
    tmp_path: Path, family: str, attention: str
) -> None:
    path = build_family_checkpoint(tmp_path, family, tied=False)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=attention
    ).eval()
    sharing = prompt_sharing(model)
    assert sharing is not None and sharing.max_len > 64  # no window, or Gemma's 4096
    assert sharing.hidden_size == 128
    weights = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]  # a filler row too
    want = _policy_run(model, build_padded_batch(PROMPTS, RESPONSES, 0, CPU, weights))
    shared = build_batch(PROMPTS, RESPONSES, 0, CPU, weights, sharing=sharing)
    assert shared.shared
    got = _policy_run(model, shared)
    for name, a, b in zip(("logp", "entropy", "loss", "grads"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0, msg=name)
    assert float(want[2].abs()) > 0.1 and float(want[3].abs().max()) > 1e-3


def test_shared_values_match_padded(tiny_checkpoint: Path) -> None:
    critic = load_critic(tiny_checkpoint, CPU, seed=0)
    out = []
    for batch in (
        build_padded_batch(PROMPTS, RESPONSES, 0, CPU),
        build_shared_batch(PROMPTS, RESPONSES, 0, CPU),
    ):
        critic.zero_grad(set_to_none=True)
        values = value_forward(critic, batch) * batch.response_mask
        (values.square().sum() / batch.response_mask.sum()).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in critic.parameters() if p.grad is not None])
        out.append((values.detach(), grads))
    torch.testing.assert_close(out[1][0], out[0][0], atol=TOL, rtol=0)
    torch.testing.assert_close(out[1][1], out[0][1], atol=TOL, rtol=0)
    assert float(out[0][0].abs().max()) > 0


def test_prompt_sharing_follows_the_attention() -> None:
    def bound(impl: str, **text: Any) -> int | None:
        model = nn.Linear(1, 1)
        config = SimpleNamespace(_attn_implementation=impl, hidden_size=64, **text)
        config.get_text_config = lambda: config
        model.config = config  # type: ignore[assignment]
        sharing = prompt_sharing(model)
        return None if sharing is None else sharing.max_len

    assert bound("flash_attention_2") is None  # takes no 4-D mask
    assert (bound("sdpa", sliding_window=None) or 0) > 10**9
    slides = ["sliding_attention", "full_attention"]
    assert bound("sdpa", sliding_window=16, layer_types=slides) == 16
    full = ["full_attention", "full_attention"]
    assert (bound("eager", sliding_window=16, layer_types=full) or 0) > 10**9
    # no layer types: the window holds unless use_sliding_window says it is off
    assert bound("sdpa", sliding_window=16) == 16
    assert (bound("sdpa", sliding_window=16, use_sliding_window=False) or 0) > 10**9


def _group_samples(make_samples: Callable[..., list[TrainSample]]) -> list[TrainSample]:
    """Three groups of three (conftest's samples, each group given its first member's
    prompt): uneven responses, varied rewards."""
    rewards = [1.0, 0.0, 0.5, 0.2, 0.9, 0.0, 1.0, 1.0, 0.3]
    samples = make_samples(rewards, group_size=3)
    return [replace(s, prompt_ids=samples[3 * s.group_id].prompt_ids) for s in samples]


def _sequences(samples: list[TrainSample]) -> tuple[list[Any], list[Any]]:
    return [s.prompt_ids for s in samples], [s.response_ids for s in samples]


def _worker(path: Path, shared: bool) -> LearnerWorker:
    config = learner_config(
        {"optimizer": {"lr": 1e-3, "weight_decay": 0.0}, "update": {"micro_batch_size": 6}},
        algorithm="ppo",
        update={"epochs": 2},
        kl={"use_reference": True, "coef": 0.05},
        loss={"entropy_coef": 0.01},
        memory=LearnerMemoryConfig(shared_prompts=shared),
    )
    return LearnerWorker(config, path)


def _count_tokens(worker: LearnerWorker) -> list[int]:
    """Tokens the actor's embedding looks up, a list the hook appends to per call."""
    seen: list[int] = []
    embeddings = worker.actor.get_input_embeddings()
    embeddings.register_forward_hook(lambda _m, args, _out: seen.append(args[0].numel()))
    return seen


def test_a_ppo_step_with_shared_prompts_matches_one_row_per_sample(
    tiny_checkpoint: Path, make_samples: Callable[..., list[TrainSample]]
) -> None:
    """PPO with a critic, a KL reference and two epochs: every metric, the weights after the
    step and the served log-probs; the shared step's actor sees each group's prompt once."""
    samples = _group_samples(make_samples)
    plain, shared = _worker(tiny_checkpoint, False), _worker(tiny_checkpoint, True)
    assert plain.prompt_sharing is None
    assert shared.prompt_sharing is not None and shared.prompt_sharing.max_len > 64
    plain_tokens, shared_tokens = _count_tokens(plain), _count_tokens(shared)
    m_plain, m_shared = plain.train_step(samples).metrics, shared.train_step(samples).metrics
    assert set(m_shared) == set(m_plain)
    for key, value in m_plain.items():
        if key.startswith("perf/") or key.startswith("timing/"):
            continue
        assert m_shared[key] == pytest.approx(value, abs=TOL, rel=TOL), key
    assert m_plain["critic/vf_loss"] > 0 and m_plain["actor/kl_loss"] > 0
    plain_params = dict(plain.full_state_dict_items())
    for key, tensor in shared.full_state_dict_items():
        torch.testing.assert_close(tensor, plain_params[key], atol=TOL, rtol=0, msg=key)
    # micro-batches of 6 rows: groups 0 and 1, then group 2; each run three times (the old
    # log-probs, then two epochs), in one row per prompt against one row per sample
    parts = [samples[:6], samples[6:]]
    layouts = [
        [build(*_sequences(part), 0, CPU).input_ids.numel() for part in parts]
        for build in (build_shared_batch, build_padded_batch)
    ]
    assert shared_tokens == layouts[0] * 3 and plain_tokens == layouts[1] * 3
    assert layouts[0][0] < layouts[1][0] and layouts[0][1] < layouts[1][1]
    prompts, responses = _sequences(samples)
    for got, want in zip(
        shared.compute_logprobs(prompts, responses, 1.0),
        plain.compute_logprobs(prompts, responses, 1.0),
        strict=True,
    ):
        assert got == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize(
    "memory",
    [LearnerMemoryConfig(packing=True), LearnerMemoryConfig(shared_prompts=False)],
    ids=["packing", "off"],
)
def test_the_learner_keeps_one_row_per_sample_where_asked(
    tiny_checkpoint: Path, memory: LearnerMemoryConfig
) -> None:
    config = learner_config({"update": {"micro_batch_size": 6}}, memory=memory)
    assert LearnerWorker(config, tiny_checkpoint).prompt_sharing is None
