"""Conversation messages to token ids, each message tokenised once, with the chat template.

A multi-turn trajectory is built by appending, never by re-rendering: the opening messages
are rendered (with the generation prompt) and tokenised once; after each policy turn, the
tokens the engine generated are kept as they are, and the environment's answer is rendered as
the *difference* the template makes when those messages follow an assistant turn. That
difference is found once per template with placeholder messages:

    with_turn = render([user, assistant])                     # ends "...<eos>\\n"
    with_obs  = render([user, assistant, *observation], generation prompt)
    observation text = (with_turn after its last EOS) + with_obs[len(with_turn):]

so the observation's ids are exactly what the template writes between the policy's EOS and
the next assistant turn (for ChatML: ``\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>
assistant\\n``). A turn cut by the token limit has no EOS; the loop adds the EOS id first, as
a template token (loss mask 0). Re-tokenising the decoded conversation instead would let the
tokenizer merge across turn boundaries differently from what the engine sampled: the
learner would train on tokens the policy never produced (off-policy without knowing it).

A template that is not prefix-stable (rendering more messages changes the text of earlier
ones) cannot be extended this way and is refused with an error naming the check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridflow.arrays import TokenArray, as_tokens
from hybridflow.envs.base import Message

_PLACEHOLDER_USER = Message("user", "0")
_PLACEHOLDER_ASSISTANT = Message("assistant", "1")


class ChatTokens:
    """Renders and tokenises conversation pieces for one tokenizer (a transformers
    tokenizer with a ``chat_template`` and an ``eos_token``)."""

    def __init__(self, tokenizer: Any) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "multi-turn episodes need a tokenizer with a chat_template (the observations "
                "are rendered with it)"
            )
        eos = getattr(tokenizer, "eos_token", None)
        if not eos or tokenizer.eos_token_id is None:
            raise ValueError("multi-turn episodes need a tokenizer with an eos_token")
        self.tokenizer = tokenizer
        self.eos_token: str = eos
        self.eos_token_id: int = int(tokenizer.eos_token_id)
        with_turn = self._render([_PLACEHOLDER_USER, _PLACEHOLDER_ASSISTANT], False)
        end = with_turn.rfind(self.eos_token)
        if end < 0:
            raise ValueError(
                f"the chat template does not end an assistant turn with the EOS token "
                f"{self.eos_token!r}: a policy turn (which stops on EOS) cannot be followed "
                "by an observation token-exactly"
            )
        self._with_turn = with_turn
        self._after_eos = with_turn[end + len(self.eos_token) :]

    def _render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        text = self.tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    def encode(self, text: str) -> TokenArray:
        """Rendered text as ids (no special tokens added: the template wrote its own)."""
        return as_tokens(self.tokenizer.encode(text, add_special_tokens=False))

    def opening(self, messages: Sequence[Message]) -> TokenArray:
        """The episode's prompt: the opening messages with the generation prompt."""
        if not messages:
            raise ValueError("an episode's opening has no messages")
        ids = self.encode(self._render(messages, True))
        if ids.size == 0:
            raise ValueError("an episode's opening renders to zero tokens")
        return ids

    def observation(self, messages: Sequence[Message], turn_ended_with_eos: bool) -> TokenArray:
        """What follows a policy turn: the EOS when the turn did not end with one, the
        template's text after an assistant turn's EOS, the messages, the generation prompt."""
        if not messages:
            raise ValueError("an observation has no messages")
        full = self._render([_PLACEHOLDER_USER, _PLACEHOLDER_ASSISTANT, *messages], True)
        if not full.startswith(self._with_turn):
            raise ValueError(
                "the chat template is not prefix-stable: rendering the observation changed the "
                "text of the turns before it, so it cannot be appended token-exactly"
            )
        ids = self.encode(self._after_eos + full[len(self._with_turn) :])
        if turn_ended_with_eos:
            return ids
        return as_tokens([self.eos_token_id, *ids.tolist()])

    def decode_turn(self, ids: TokenArray) -> str:
        """A policy turn as the environment sees it: special tokens (EOS) stripped."""
        return str(self.tokenizer.decode(ids.tolist(), skip_special_tokens=True))
