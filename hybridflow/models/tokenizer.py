"""Character-level tokenizer of the built-in model: one token per printable ASCII character.

Built with the ``tokenizers`` library (a WordLevel model over single characters, a regex
pre-tokenizer that isolates every character, a Fuse decoder) and wrapped as a transformers fast
tokenizer, so ``save_pretrained`` writes ordinary tokenizer files that
``AutoTokenizer.from_pretrained`` loads like any checkpoint's.

No special token is added on encode (no BOS, no EOS): a prompt encodes to exactly its characters
whichever way a caller tokenizes it. The chat template concatenates message contents, so a
single-turn ``[{"role": "user", "content": "3+4="}]`` renders to the plain prompt ``"3+4="``.

This module knows nothing about models, tasks or where files are cached.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
"""Special tokens, in id order: pad=0, bos=1, eos=2, unk=3."""

CHARACTERS: tuple[str, ...] = tuple(chr(c) for c in range(32, 127)) + ("\n", "\t")
"""Ordinary tokens after the specials: printable ASCII (space..~), newline and tab."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)
"""Contents joined by newlines; assistant turns end with EOS; no generation prefix."""


def char_vocab() -> dict[str, int]:
    """Token → id for the specials followed by every character in ``CHARACTERS``."""
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    assert len(set(tokens)) == len(tokens), "duplicate token in the character vocabulary"
    assert all(c in string.printable for c in CHARACTERS)
    return {tok: i for i, tok in enumerate(tokens)}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer as a transformers fast tokenizer (not yet saved anywhere)."""
    backend = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
