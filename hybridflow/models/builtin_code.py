"""The built-in policy ``builtin:tiny-code``, as the spec its shipped weights were built from:
``tiny``'s architecture (a small Llama over the character tokenizer) warm-started on the
``builtin:code`` format (``hybridflow/data/code_task.py``) instead of arithmetic.

As for ``tiny``, the warm start runs clean labels first (the model learns to write the
function), then noisy ones (``warmup_solution``: a near miss with probability
``1 - label_correct_prob``: a constant off by one, another operator, a missing colon, ``y``
for ``x``), so the sampled program is often wrong in each of the ways the code scorer names,
while the right function stays the likeliest: room for RL. Built by
``hybridflow/builtins_build/policy.py``; this module knows nothing about how.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodeBuiltinSpec:
    """Everything that determines ``builtin:tiny-code``'s checkpoint."""

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    """Two heads of 32 (vLLM's CPU attention needs head_dim >= 32)."""
    max_position_embeddings: int = 128
    init_seed: int = 0
    """Seed of the weight initialisation and of the warm-start draws."""
    warmup_batch_size: int = 64
    clean_steps: int = 600
    """Phase 1: supervised steps on the right functions."""
    clean_lr: float = 3e-3
    noisy_steps: int = 200
    """Phase 2: supervised steps on noisy targets."""
    noisy_lr: float = 3e-4
    label_correct_prob: float = 0.4
    """Phase 2: probability that a target is the right function (else a near miss)."""
