"""The built-in policies ``builtin:tiny``, ``builtin:tiny-random`` and ``builtin:tiny-qwen3``:
what they are, as the specs their shipped weights were built from (``builtin:tiny-tools``, the
multi-turn one, is specified in ``builtin_tools.py``; its spec is registered here with the
others).

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
deliberately (``hybridflow/builtins_build/policy.py``), behind the quality gates of
``hybridflow/builtins_build/quality.py``. This module knows nothing about services, RL or
rewards, and nothing about how a spec is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.data.arith import DEFAULT_MAX_OPERAND
from hybridflow.models.builtin_code import CodeBuiltinSpec
from hybridflow.models.builtin_tools import ToolsBuiltinSpec


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


POLICY_SPECS: dict[str, BuiltinSpec | ToolsBuiltinSpec | CodeBuiltinSpec] = {
    "tiny": BuiltinSpec(),
    "tiny-random": BuiltinSpec(clean_steps=0, noisy_steps=0),
    "tiny-qwen3": Qwen3BuiltinSpec(),
    "tiny-tools": ToolsBuiltinSpec(),
    "tiny-code": CodeBuiltinSpec(),
}
"""Built-in model names and their specs. ``tiny-random`` is ``tiny`` without the warm start
(the seeded random initialisation): the cold-start comparison of the algorithm suite.
``tiny-qwen3`` is warm-started like ``tiny`` with its prompts in ChatML. ``tiny-tools`` plays
the built-in environments (``builtin_tools.py``); ``tiny-code`` writes the functions of
``builtin:code`` (``builtin_code.py``)."""
