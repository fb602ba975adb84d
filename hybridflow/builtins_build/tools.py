"""How ``builtin:tiny-tools`` is built from its spec (``hybridflow/models/builtin_tools.py``
says what it is and what the warm start teaches): its BPE trained on arith prompts and on the
environments' conversations, then the supervised warm start on whole episodes, tokenised
exactly as the multi-turn loop builds them (``ChatTokens``: the opening, each assistant turn's
ids then EOS, each observation's ids), with the loss on the assistant turns only.

The caller's global torch RNG state is left untouched. This module knows nothing about
services, RL or rewards.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hybridflow.data.arith import DEFAULT_MAX_OPERAND, arith_ground_truth, arith_prompt
from hybridflow.envs.base import Message
from hybridflow.envs.calculator import (
    NO_ACTION_FEEDBACK,
    NO_TOOL_ERROR,
    calc_demonstration,
    calc_direct_demonstration,
    calc_task,
)
from hybridflow.envs.guess_number import (
    DEFAULT_HI,
    DEFAULT_LO,
    format_reminder,
    guess_demonstration,
    guess_quarter_demonstration,
    guess_task,
)
from hybridflow.models.builtin_tools import ToolsBuiltinSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from hybridflow.envs.chat_tokens import ChatTokens


class Qwen3Shape(Protocol):
    """The spec fields a Qwen3 config is made from (read-only: specs are frozen)."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...
    @property
    def vocab_multiple(self) -> int: ...


def warm_start_conversation(spec: ToolsBuiltinSpec, rng: random.Random) -> list[Message]:
    """One demonstration of the warm-start mix (module docstring)."""
    if rng.random() < spec.calc_fraction:
        task = calc_task(rng)
        if rng.random() < spec.calc_direct_prob:
            return calc_direct_demonstration(task, rng)
        return calc_demonstration(task)
    task = guess_task(rng)
    if rng.random() < spec.guess_quarter_prob:
        return guess_quarter_demonstration(task)
    return guess_demonstration(task)


def tokenizer_corpus(spec: ToolsBuiltinSpec) -> list[str]:
    """The tokenizer's training text: arith prompts with their answers, demonstrations of
    both environments, and the environments' other answers (errors, reminders)."""
    from hybridflow.models.bpe_tokenizer import chatml_text, chatml_turns

    grid = range(DEFAULT_MAX_OPERAND + 1)
    corpus = [
        chatml_turns(arith_prompt(a, b), arith_ground_truth(a, b)) for a in grid for b in grid
    ]
    rng = random.Random(f"tiny-tools-corpus:{spec.demo_seed}")
    for _ in range(spec.corpus_conversations):
        calc = calc_task(rng)
        guess = guess_task(rng)
        for conversation in (
            calc_demonstration(calc),
            calc_direct_demonstration(calc, rng),
            guess_demonstration(guess),
            guess_quarter_demonstration(guess),
        ):
            corpus.append(chatml_text([(m.role, m.content) for m in conversation]))
    others = [
        ("user", NO_ACTION_FEEDBACK),
        ("tool", f"error: {NO_TOOL_ERROR}"),
        ("user", format_reminder(DEFAULT_LO, DEFAULT_HI)),
    ]
    corpus.append(chatml_text(others))
    return corpus


def qwen3_config(spec: Qwen3Shape, tokenizer: PreTrainedTokenizerBase) -> Any:
    """The Qwen3 config of a spec's shape over ``tokenizer`` (tied head, ChatML's EOS and pad,
    the vocabulary padded to ``vocab_multiple``)."""
    from transformers import Qwen3Config

    vocab = -(-len(tokenizer) // spec.vocab_multiple) * spec.vocab_multiple
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def episode_tokens(
    chat: ChatTokens, conversation: Sequence[Message]
) -> tuple[list[int], list[int]]:
    """``conversation``'s ids as the multi-turn loop builds them, and its labels: the
    assistant turns' ids and EOS, -100 elsewhere."""
    first = next(i for i, m in enumerate(conversation) if m.role == "assistant")
    ids = chat.opening(conversation[:first]).tolist()
    labels = [-100] * len(ids)
    pending: list[Message] = []
    for message in conversation[first:]:
        if message.role != "assistant":
            pending.append(message)
            continue
        if pending:
            observation = chat.observation(pending, True).tolist()
            ids += observation
            labels += [-100] * len(observation)
            pending = []
        turn = chat.tokenizer.encode(message.content, add_special_tokens=False)
        turn.append(chat.eos_token_id)
        ids += turn
        labels += turn
    return ids, labels


def build_tools_checkpoint(spec: ToolsBuiltinSpec, out_dir: Path) -> None:
    """Train the tokenizer, initialise and warm-start the model of ``spec``, save both into
    ``out_dir``. The caller's global torch RNG state is left untouched."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.envs.chat_tokens import ChatTokens
    from hybridflow.models.bpe_tokenizer import build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer(tokenizer_corpus(spec), spec.bpe_vocab_size)
    tokenizer.model_max_length = spec.max_position_embeddings
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        model = AutoModelForCausalLM.from_config(qwen3_config(spec, tokenizer)).float()
        _warm_start(model, ChatTokens(tokenizer), spec)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _warm_start(model: PreTrainedModel, chat: ChatTokens, spec: ToolsBuiltinSpec) -> None:
    """``spec.steps`` AdamW steps on demonstrations; loss on the assistant turns only."""
    import torch

    rng = random.Random(f"tiny-tools-demos:{spec.demo_seed}")
    pad = int(chat.tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    warmup = max(1, spec.steps // 20)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 1.0 - 0.9 * (step - warmup) / max(1, spec.steps - warmup)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    for _ in range(spec.steps):
        pairs = [
            episode_tokens(chat, warm_start_conversation(spec, rng)) for _ in range(spec.batch_size)
        ]
        width = max(len(ids) for ids, _ in pairs)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in pairs])
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in pairs])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in pairs])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
