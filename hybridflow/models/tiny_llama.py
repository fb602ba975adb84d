"""The built-in models' architecture: a small Llama over the character tokenizer.

``builtin:tiny`` (a causal LM) and ``builtin:tiny-rm`` (a one-logit sequence classifier) share
it; their specs carry the sizes. Imports transformers only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedTokenizerBase


class LlamaSizes(Protocol):
    """What a built-in spec says about the architecture (read-only: specs are frozen)."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...


def tiny_llama_config(spec: LlamaSizes, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """A Llama config of ``spec``'s sizes over ``tokenizer`` (tied embeddings, no grouped-query
    attention, the tokenizer's special tokens)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
