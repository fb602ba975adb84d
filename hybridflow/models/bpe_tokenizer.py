"""A byte-level BPE tokenizer with a ChatML chat template, trained locally on a given corpus:
the tokenizer of ``builtin:tiny-qwen3`` (arith text) and ``builtin:tiny-tools`` (arith text and
tool-using conversations), shaped like Qwen's.

Like Qwen2/Qwen3's tokenizers: a regex pre-tokenizer that splits digits one by one and words
from punctuation, byte-level encoding (every byte string encodes; nothing is unknown), and the
specials ``<|endoftext|>`` (pad), ``<|im_start|>`` and ``<|im_end|>`` (EOS, the end of each
turn). Training with the ``tokenizers`` library on a fixed corpus in a fixed order is
deterministic; the shipped files are pinned by hash anyway (``builtin.py``).

This module knows nothing about models, tasks or where files are cached.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
"""Special tokens, in id order after the 256 byte tokens' merges are appended."""

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenizer pattern: single digits, words with one leading non-letter, runs of
punctuation, newlines, spaces."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, as Qwen's checkpoints render it (without their tool and thinking blocks): every role
the same way, ``tool`` included (``<|im_start|>tool\n...<|im_end|>``)."""


def chatml_text(messages: Sequence[tuple[str, str]], generation_prompt: bool = False) -> str:
    """``(role, content)`` messages as ``CHATML_TEMPLATE`` renders them, without the template
    (a tokenizer's training text is written before the tokenizer exists)."""
    text = "".join(f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in messages)
    return text + (f"{IM_START}assistant\n" if generation_prompt else "")


def chatml_turns(prompt: str, answer: str | None = None) -> str:
    """``prompt`` as a user turn plus the generation prompt; with ``answer``, the assistant's
    finished turn too (the text the tokenizer is trained on)."""
    text = chatml_text([("user", prompt)], generation_prompt=True)
    return text if answer is None else f"{text}{answer}{IM_END}\n"


def build_bpe_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of at most ``vocab_size`` tokens trained on ``corpus``, as a
    transformers fast tokenizer with ChatML (not yet saved anywhere)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=ENDOFTEXT,
        eos_token=IM_END,
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
