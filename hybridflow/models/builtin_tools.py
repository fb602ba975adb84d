"""The built-in policy ``builtin:tiny-tools``: a Qwen3-shaped model that plays the built-in
environments (``builtin:calc`` with its calculator tool, ``builtin:guess``), as the spec its
shipped weights were built from.

Its tokenizer is ``tiny-qwen3``'s kind (byte-level BPE, digits one by one, ChatML rendering
every role, ``tool`` included) trained on arith prompts and on the environments'
conversations, so ``<tool_call>``, the JSON around an expression, ``<answer>`` and ``<guess>``
are a few tokens each rather than the ~120 a call costs in ``tiny-qwen3``'s arith-only BPE.

The warm start is supervised on whole episodes, tokenised exactly as the multi-turn loop builds
them, with the loss on the assistant turns only. Like ``builtin:tiny``'s noisy labels, the
demonstrations leave RL something to learn:

- calc: ``calc_direct_prob`` of them answer at once, without the tool, with a wrong number
  (the true answer with a few digits changed); the rest call the calculator on the task's
  expression and copy its result. The model learns to call the tool in about half of its
  episodes, and to copy a result it has; RL can raise the tool-use rate and the reward.
- guess: ``guess_quarter_prob`` of them search by quarters (slower, still within the allowed
  guesses), the rest by binary search; RL can lower the turns per success.

The demonstrations' tasks come from their own random stream (``demo_seed``), apart from the
``builtin:calc`` / ``builtin:guess`` rows an RL run trains on. Like every built-in, the build is
run by ``make builtins`` (``hybridflow/builtins_build/tools.py``) and its weights ship
(``builtin.py``). This module knows nothing about services, RL or rewards, and nothing about
how the spec is built.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolsBuiltinSpec:
    """Everything that determines ``builtin:tiny-tools`` (module docstring)."""

    hidden_size: int = 128
    """Model width."""
    intermediate_size: int = 384
    """MLP width."""
    num_hidden_layers: int = 2
    """Transformer blocks: two suffice to copy a number from an earlier turn, when it is
    copied verbatim (the calc demonstrations spell the expression as the question does)."""
    num_attention_heads: int = 4
    """Four query heads of 32 (vLLM's CPU attention needs head_dim >= 32)."""
    num_key_value_heads: int = 2
    """Grouped-query attention, like Qwen3's."""
    max_position_embeddings: int = 512
    """A ten-guess game or a calculator episode fits with room to spare."""
    bpe_vocab_size: int = 768
    """Most tokens the BPE trainer may make."""
    vocab_multiple: int = 64
    """The model's vocabulary is the tokenizer's rounded up to this, as in Qwen's checkpoints."""
    init_seed: int = 0
    """Seed of the weight initialisation and of the batches' order."""
    demo_seed: int = 1
    """Seed of the demonstrations' tasks (a stream apart from the RL datasets' rows)."""
    corpus_conversations: int = 300
    """Conversations of each kind in the tokenizer's training text."""
    steps: int = 3000
    """Supervised steps of the warm start."""
    batch_size: int = 16
    """Conversations per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warm-up over 5% of the steps, then linear decay to
    a tenth)."""
    calc_fraction: float = 0.65
    """Share of the calculator's episodes in the warm start (the rest: the guessing game, which
    is learnt sooner)."""
    calc_direct_prob: float = 0.5
    """Share of calc demonstrations that answer without the tool, wrongly."""
    guess_quarter_prob: float = 0.75
    """Share of guess demonstrations that search by quarters instead of halves."""
