"""The built-in policies ``builtin:tiny``, ``builtin:tiny-random`` and ``builtin:tiny-qwen3``:
what they are and how they are built (``builtin:tiny-tools``, the multi-turn one, is specified
and built in ``builtin_tools.py``; its spec is registered here with the others).

A small Llama over the character tokenizer. ``tiny`` ends its build with a short supervised warm
start on the ``builtin:arith`` format, since real post-training starts from a pretrained model:
the model learns "digits then EOS" and is unsure about the digits, which RL then sharpens.

The warm-start labels are noisy on purpose: each target is the true sum with probability
``label_correct_prob`` and otherwise a near miss (off by 1..``label_max_offset``). Trained to
convergence, the model's sampled (temperature 1) accuracy sits near that probability while the
true sum stays its most likely answer, a calibrated start that does not hinge on stopping SFT
at an exact step.

The build is seeded, but its float results differ from one CPU to another, so users never run
it: the weights it made are shipped (``builtin.py``) and ``make builtins`` rebuilds them
deliberately, behind the quality gates of ``hybridflow/builtins_build/quality.py``. This module
knows nothing about services, RL or rewards.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.data.arith import DEFAULT_MAX_OPERAND, arith_ground_truth, arith_prompt
from hybridflow.models.builtin_tools import ToolsBuiltinSpec, build_tools_checkpoint, qwen3_config

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class BuiltinSpec:
    """Everything that determines a built-in checkpoint; its hash names the cache directory."""

    hidden_size: int = 64
    """Model width."""
    intermediate_size: int = 256
    """MLP width."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 2
    """Attention heads (also the key/value heads: no grouped-query attention). Two heads of 32:
    vLLM's CPU attention needs head_dim >= 32, and two heads still split over two TP ranks."""
    max_position_embeddings: int = 128
    """Longest sequence the rotary embedding is configured for."""
    init_seed: int = 0
    """Seed of the weight initialisation and of the warm-start data."""
    max_operand: int = DEFAULT_MAX_OPERAND
    """Warm-start problems use operands 0..max_operand, like ``builtin:arith``."""
    warmup_batch_size: int = 64
    """Problems per warm-start step (both phases)."""
    clean_steps: int = 500
    """Phase 1: supervised steps on true sums (the model learns the format and the task)."""
    clean_lr: float = 3e-3
    """AdamW learning rate of phase 1."""
    noisy_steps: int = 200
    """Phase 2: supervised steps on noisy labels (the model becomes unsure of the digits)."""
    noisy_lr: float = 3e-4
    """AdamW learning rate of phase 2 (low, so the true sum mostly stays the likeliest)."""
    label_correct_prob: float = 0.4
    """Phase 2: probability that a target is the true sum (else a near miss)."""
    label_max_offset: int = 2
    """Phase 2: near misses are the sum plus or minus 1..label_max_offset (never negative)."""


@dataclass(frozen=True)
class Qwen3BuiltinSpec(BuiltinSpec):
    """A built-in shaped like a real checkpoint: Qwen3 (q/k norms, grouped-query attention,
    tied head) over a byte-level BPE tokenizer with ChatML, trained on the task's text."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_attention_heads: int = 4
    """Four heads of 32 (vLLM's CPU attention needs head_dim >= 32)."""
    num_key_value_heads: int = 2
    """Grouped-query attention: two query heads per key/value head, like Qwen3's."""
    max_position_embeddings: int = 256
    bpe_vocab_size: int = 512
    """Most tokens the BPE trainer may make (the task's text needs fewer)."""
    vocab_multiple: int = 64
    """The model's vocabulary is the tokenizer's rounded up to this, as in Qwen's checkpoints
    (rows no token uses; vLLM pads to 64 as well)."""


POLICY_SPECS: dict[str, BuiltinSpec | ToolsBuiltinSpec] = {
    "tiny": BuiltinSpec(),
    "tiny-random": BuiltinSpec(clean_steps=0, noisy_steps=0),
    "tiny-qwen3": Qwen3BuiltinSpec(),
    "tiny-tools": ToolsBuiltinSpec(),
}
"""Built-in model names and their specs. ``tiny-random`` is ``tiny`` without the warm start
(the seeded random initialisation): the cold-start comparison of the algorithm suite.
``tiny-qwen3`` is warm-started like ``tiny`` with its prompts in ChatML. ``tiny-tools`` plays
the built-in environments (``builtin_tools.py``)."""


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """``prompt`` as a user turn through the tokenizer's chat template, with the generation
    prompt: what ``builtin:arith`` gives the model (the character tokenizer's template leaves
    the prompt as it is)."""
    chat = [{"role": "user", "content": prompt}]
    return str(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))


def warmup_example(
    a: int, b: int, correct_prob: float, max_offset: int, rng: random.Random
) -> tuple[str, str]:
    """One warm-start (prompt, target) pair; the target is a near miss with some probability."""
    answer = int(arith_ground_truth(a, b))
    if rng.random() >= correct_prob and max_offset > 0:
        offsets = [d for d in range(-max_offset, max_offset + 1) if d]
        offsets = [d for d in offsets if answer + d >= 0]
        answer += rng.choice(offsets)
    return arith_prompt(a, b), str(answer)


def build_checkpoint(spec: BuiltinSpec | ToolsBuiltinSpec, out_dir: Path) -> None:
    """Initialise, warm-start and save the model and tokenizer of ``spec`` into ``out_dir``.

    The caller's global torch RNG state is left untouched.
    """
    if isinstance(spec, ToolsBuiltinSpec):
        build_tools_checkpoint(spec, out_dir)
        return
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer, config = _tokenizer_and_config(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        model = AutoModelForCausalLM.from_config(config).float()
        _supervised_steps(model, tokenizer, spec, spec.clean_steps, spec.clean_lr, 1.0)
        _supervised_steps(
            model, tokenizer, spec, spec.noisy_steps, spec.noisy_lr, spec.label_correct_prob
        )
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _tokenizer_and_config(spec: BuiltinSpec) -> tuple[PreTrainedTokenizerBase, Any]:
    """The tokenizer and the model config of ``spec``."""
    if not isinstance(spec, Qwen3BuiltinSpec):
        from hybridflow.models.tiny_llama import tiny_llama_config
        from hybridflow.models.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        return tokenizer, tiny_llama_config(spec, tokenizer)
    from hybridflow.models.bpe_tokenizer import build_bpe_tokenizer, chatml_turns

    answers = range(2 * spec.max_operand + spec.label_max_offset + 1)
    corpus = [chatml_turns(arith_prompt(a, b), str(n)) for a, b in _grid(spec) for n in answers]
    tokenizer = build_bpe_tokenizer(corpus, spec.bpe_vocab_size)
    return tokenizer, qwen3_config(spec, tokenizer)


def _grid(spec: BuiltinSpec) -> list[tuple[int, int]]:
    return [(a, b) for a in range(spec.max_operand + 1) for b in range(spec.max_operand + 1)]


def _supervised_steps(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    spec: BuiltinSpec,
    num_steps: int,
    lr: float,
    correct_prob: float,
) -> None:
    """``num_steps`` AdamW steps on arithmetic examples; loss on the answer and EOS only."""
    import torch

    rng = random.Random(f"{spec.init_seed}-{correct_prob}")
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(num_steps):
        seqs: list[list[int]] = []
        labels: list[list[int]] = []
        for _ in range(spec.warmup_batch_size):
            a, b = rng.randint(0, spec.max_operand), rng.randint(0, spec.max_operand)
            prompt, target = warmup_example(a, b, correct_prob, spec.label_max_offset, rng)
            prompt_ids = tokenizer.encode(
                render_prompt(tokenizer, prompt), add_special_tokens=False
            )
            target_ids = tokenizer.encode(target, add_special_tokens=False) + [eos]
            seqs.append(prompt_ids + target_ids)
            labels.append([-100] * len(prompt_ids) + target_ids)
        width = max(len(seq) for seq in seqs)
        input_ids = torch.tensor([seq + [pad] * (width - len(seq)) for seq in seqs])
        mask = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq in seqs])
        label_ids = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=label_ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
