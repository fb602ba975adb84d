"""How the built-in policies are built from their specs (``hybridflow/models/builtin_policy.py``
says what they are): a seeded initialisation, then the supervised warm start on the
``builtin:arith`` format (``builtin:tiny-code``: the ``builtin:code`` format), clean labels
first, noisy ones after. ``builtin:tiny-tools`` is built by ``tools.py``.

The caller's global torch RNG state is left untouched. This module knows nothing about
services, RL or rewards.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.builtins_build.tools import build_tools_checkpoint, qwen3_config
from hybridflow.data.arith import arith_ground_truth, arith_prompt
from hybridflow.data.code_task import all_problems, warmup_solution
from hybridflow.models.builtin_code import CodeBuiltinSpec
from hybridflow.models.builtin_policy import BuiltinSpec, Qwen3BuiltinSpec
from hybridflow.models.builtin_tools import ToolsBuiltinSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """``prompt`` as a user turn through the tokenizer's chat template, with the generation
    prompt: what ``builtin:arith`` gives the model (the character tokenizer's template leaves
    the prompt as it is)."""
    chat = [{"role": "user", "content": prompt}]
    return str(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))


def warmup_example(
    a: int, b: int, correct_prob: float, max_offset: int, rng: random.Random
) -> tuple[str, str]:
    """One warm-start (prompt, target) pair; the target is a near miss with some probability."""
    answer = int(arith_ground_truth(a, b))
    if rng.random() >= correct_prob and max_offset > 0:
        offsets = [d for d in range(-max_offset, max_offset + 1) if d]
        offsets = [d for d in offsets if answer + d >= 0]
        answer += rng.choice(offsets)
    return arith_prompt(a, b), str(answer)


Example = Callable[[random.Random, float], tuple[str, str]]
"""(rng, probability of a right target) -> one warm-start (prompt, target) pair."""


def arith_example(spec: BuiltinSpec) -> Example:
    """``builtin:arith`` pairs: operands 0..max_operand, near misses off by
    1..label_max_offset."""

    def example(rng: random.Random, correct_prob: float) -> tuple[str, str]:
        a, b = rng.randint(0, spec.max_operand), rng.randint(0, spec.max_operand)
        return warmup_example(a, b, correct_prob, spec.label_max_offset, rng)

    return example


def code_example(rng: random.Random, correct_prob: float) -> tuple[str, str]:
    """``builtin:code`` pairs: any problem of the task (``warmup_solution``)."""
    problem = rng.choice(_CODE_PROBLEMS)
    return problem.prompt, warmup_solution(problem, correct_prob, rng)


_CODE_PROBLEMS = all_problems()


def build_checkpoint(spec: BuiltinSpec | ToolsBuiltinSpec | CodeBuiltinSpec, out_dir: Path) -> None:
    """Initialise, warm-start and save the model and tokenizer of ``spec`` into ``out_dir``.

    The caller's global torch RNG state is left untouched.
    """
    if isinstance(spec, ToolsBuiltinSpec):
        build_tools_checkpoint(spec, out_dir)
        return
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer, config = _tokenizer_and_config(spec)
    example = code_example if isinstance(spec, CodeBuiltinSpec) else arith_example(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        model = AutoModelForCausalLM.from_config(config).float()
        _supervised_steps(model, tokenizer, spec, example, spec.clean_steps, spec.clean_lr, 1.0)
        _supervised_steps(
            model,
            tokenizer,
            spec,
            example,
            spec.noisy_steps,
            spec.noisy_lr,
            spec.label_correct_prob,
        )
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _tokenizer_and_config(
    spec: BuiltinSpec | CodeBuiltinSpec,
) -> tuple[PreTrainedTokenizerBase, Any]:
    """The tokenizer and the model config of ``spec``."""
    if not isinstance(spec, Qwen3BuiltinSpec):
        from hybridflow.models.tiny_llama import tiny_llama_config
        from hybridflow.models.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        return tokenizer, tiny_llama_config(spec, tokenizer)
    from hybridflow.models.bpe_tokenizer import build_bpe_tokenizer, chatml_turns

    answers = range(2 * spec.max_operand + spec.label_max_offset + 1)
    corpus = [chatml_turns(arith_prompt(a, b), str(n)) for a, b in _grid(spec) for n in answers]
    tokenizer = build_bpe_tokenizer(corpus, spec.bpe_vocab_size)
    return tokenizer, qwen3_config(spec, tokenizer)


def _grid(spec: BuiltinSpec) -> list[tuple[int, int]]:
    return [(a, b) for a in range(spec.max_operand + 1) for b in range(spec.max_operand + 1)]


def _supervised_steps(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    spec: BuiltinSpec | CodeBuiltinSpec,
    example: Example,
    num_steps: int,
    lr: float,
    correct_prob: float,
) -> None:
    """``num_steps`` AdamW steps on ``example``'s pairs; loss on the target and EOS only."""
    import torch

    rng = random.Random(f"{spec.init_seed}-{correct_prob}")
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(num_steps):
        seqs: list[list[int]] = []
        labels: list[list[int]] = []
        for _ in range(spec.warmup_batch_size):
            prompt, target = example(rng, correct_prob)
            prompt_ids = tokenizer.encode(
                render_prompt(tokenizer, prompt), add_special_tokens=False
            )
            target_ids = tokenizer.encode(target, add_special_tokens=False) + [eos]
            seqs.append(prompt_ids + target_ids)
            labels.append([-100] * len(prompt_ids) + target_ids)
        width = max(len(seq) for seq in seqs)
        input_ids = torch.tensor([seq + [pad] * (width - len(seq)) for seq in seqs])
        mask = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq in seqs])
        label_ids = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=label_ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
