"""The learner's memory tools (``learner.memory``): precision, activation checkpointing,
sequence packing, token-budget micro-batches, chunked log-probs and CPU offload.

Each key changes how much memory a step takes, never what it computes (beyond the rounding of
a lower precision): the tests hold each to that. Imports without torch or grpc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems


@dataclass
class LearnerMemoryConfig:
    """How the learner holds a step in memory (the results stay those of the default)."""

    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameters and compute: float32, or bfloat16 compute with float32 master weights,
    optimizer state and gradient reduction (FSDP2's MixedPrecisionPolicy on 2+ ranks;
    autocast in a single process)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping
    them."""
    packing: bool = False
    """Concatenate a micro-batch's sequences with no padding (per-sequence positions,
    attention that does not cross sequences) instead of right-padding each row."""
    shared_prompts: bool = True
    """Run a prompt once for all the samples of a micro-batch that share it (a GRPO group):
    one row holds the prompt and then each sample's response, and a 4-D attention mask keeps
    each response to the prompt and itself (``batching.build_shared_batch``). Off with
    ``packing``, router replay, attention kernels that take no such mask (flash), and for a
    batch with a sequence longer than the model's sliding window."""
    max_tokens_per_micro_batch: int = knob(0, ge=0)
    """Micro-batches by token budget (prompt + response tokens): as many sequences as fit,
    at least one; 0: ``micro_batch_size`` rows each."""
    logprob_chunk_tokens: int = knob(0, ge=0)
    """Compute log-probs and entropy this many response tokens at a time, so the
    ``[tokens, vocab]`` logits are never whole (recomputed in the backward); 0: at once."""
    full_logits: bool = False
    """Compute the output head's logits at every position, as the model's own forward does;
    false: at the response positions only (what the log-probs read; the same values)."""
    cpu_offload: bool = False
    """Keep parameters, gradients and optimizer state in CPU memory between uses (FSDP2's
    CPUOffloadPolicy; on a CPU-only learner it changes nothing)."""

    def validate(self) -> None:
        problems = list(field_problems(self, "learner.memory"))
        if self.full_logits and self.logprob_chunk_tokens > 0:
            problems.append(
                "learner.memory: full_logits computes every position's logits at once, "
                "logprob_chunk_tokens > 0 the response positions' a chunk at a time; set one"
            )
        raise_problems(problems)

    @property
    def head_chunk(self) -> int | None:
        """``policy_forward``'s ``chunk_tokens``: None with ``full_logits``."""
        return None if self.full_logits else self.logprob_chunk_tokens
