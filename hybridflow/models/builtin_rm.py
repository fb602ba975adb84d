"""The built-in reward model ``builtin:tiny-rm``: a tiny Llama sequence classifier for arith, as
the spec its shipped weights were built from.

It scores ``prompt + response`` text of the ``builtin:arith`` task (``"3+4=" + "7"``) with one
logit: positive for the right sum, negative for a near miss, another number or garbage.

The build is seeded and deterministic and uses only the train split of the arith problems
(``heldout_problems`` are never seen), in two phases on one shared transformer body:

1. language modelling of ``"a+b=" → sum, EOS`` (the body learns addition; per-token
   supervision makes it generalise to the held-out problems, a binary label alone does not);
2. the classification loss (binary cross-entropy on the score logit, half right sums, half
   wrong answers) trained jointly with the language-modelling loss, which keeps the body from
   memorising the training problems.

Only the classifier (body + score head) is saved; ``make builtins`` runs the build
(``hybridflow/builtins_build/reward_model.py``). ``ensure_builtin_model("tiny-rm")`` caches the
shipped weights like ``builtin:tiny``'s. This module knows nothing about services or how scores
are used, and nothing about how the spec is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.data.arith import DEFAULT_MAX_OPERAND


@dataclass(frozen=True)
class RewardModelSpec:
    """Everything that determines a built-in reward model; its hash names the cache dir."""

    hidden_size: int = 64
    """Model width."""
    intermediate_size: int = 256
    """MLP width."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 2
    """Attention heads (also the key/value heads)."""
    max_position_embeddings: int = 128
    """Longest sequence the rotary embedding is configured for."""
    init_seed: int = 0
    """Seed of the weight initialisation and of the training data."""
    max_operand: int = DEFAULT_MAX_OPERAND
    """Training problems use operands 0..max_operand, like ``builtin:arith``."""
    batch_size: int = 64
    """Examples per step (per loss)."""
    lm_steps: int = 600
    """Phase 1: language-modelling steps on the train problems."""
    joint_steps: int = 1200
    """Phase 2: steps of classification loss + language-modelling loss."""
    lm_lr: float = 3e-3
    """AdamW learning rate of phase 1."""
    joint_lr: float = 1e-3
    """AdamW learning rate of phase 2."""


REWARD_SPECS: dict[str, RewardModelSpec] = {"tiny-rm": RewardModelSpec()}
"""Built-in reward model names and their specs."""
