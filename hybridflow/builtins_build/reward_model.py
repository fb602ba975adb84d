"""How ``builtin:tiny-rm`` is built from its spec (``hybridflow/models/builtin_rm.py`` says what
it is and why its two phases): language modelling of the train problems, then the
classification loss jointly with it, on one shared body; only the classifier is saved. The
wrong responses it learns to score low are ``wrong_response``'s.

The caller's global torch RNG state is left untouched. This module knows nothing about
services or how scores are used.
"""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import TYPE_CHECKING

from hybridflow.data.arith import (
    arith_ground_truth,
    arith_prompt,
    heldout_problems,
    wrong_answer,
)
from hybridflow.models.builtin_rm import RewardModelSpec

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


GARBAGE_CHARACTERS = string.ascii_letters + string.digits + "+-=*/ .,"
"""Characters of the garbage responses the reward model learns to score low."""


def train_problems(max_operand: int) -> list[tuple[int, int]]:
    """The (a, b) problems the reward model trains on: all but ``heldout_problems``."""
    held = heldout_problems(max_operand)
    grid = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    return [p for p in grid if p not in held]


def wrong_response(a: int, b: int, rng: random.Random) -> str:
    """A response that is not ``a + b``: a quarter off by exactly one (the hardest case), a
    quarter near misses off by 1..3, a quarter other numbers (0..99), a quarter garbage (0-5
    random characters, possibly empty)."""
    right = arith_ground_truth(a, b)
    draw = rng.random()
    if draw < 0.25:
        return str(a + b + 1) if a + b == 0 or rng.random() < 0.5 else str(a + b - 1)
    if draw < 0.5:
        return wrong_answer(a, b, rng)
    if draw < 0.75:
        other = str(rng.randint(0, 99))
        return other if other != right else str(int(right) + 1)
    garbage = "".join(rng.choice(GARBAGE_CHARACTERS) for _ in range(rng.randint(0, 5)))
    return garbage if garbage != right else garbage + "x"


def build_reward_checkpoint(spec: RewardModelSpec, out_dir: Path) -> None:
    """Initialise, train and save the reward model and tokenizer of ``spec`` into ``out_dir``.

    The caller's global torch RNG state is left untouched.
    """
    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    from hybridflow.models.tiny_llama import tiny_llama_config
    from hybridflow.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = tiny_llama_config(spec, tokenizer)
    config.num_labels = 1  # one logit: the score
    problems = train_problems(spec.max_operand)
    rng = random.Random(f"tiny-rm-{spec.init_seed}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        lm = LlamaForCausalLM(config).float()
        classifier = LlamaForSequenceClassification(config).float()
        classifier.model = lm.model  # one shared body: the LM loss keeps it general
        lm.train()
        classifier.train()
        optimizer = torch.optim.AdamW(lm.parameters(), lr=spec.lm_lr, weight_decay=0.0)
        for _ in range(spec.lm_steps):
            _step(optimizer, _lm_loss(lm, tokenizer, problems, spec.batch_size, rng))
        optimizer = torch.optim.AdamW(classifier.parameters(), lr=spec.joint_lr, weight_decay=0.0)
        for _ in range(spec.joint_steps):
            loss = _classifier_loss(classifier, tokenizer, problems, spec.batch_size, rng)
            _step(optimizer, loss + _lm_loss(lm, tokenizer, problems, spec.batch_size, rng))
    classifier.eval()
    classifier.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def _pad(seqs: list[list[int]], fill: int) -> torch.Tensor:
    """Rows right-padded with ``fill`` to the longest."""
    import torch

    width = max(len(seq) for seq in seqs)
    return torch.tensor([seq + [fill] * (width - len(seq)) for seq in seqs])


def _mask(seqs: list[list[int]]) -> torch.Tensor:
    """Attention mask of right-padded ``seqs``."""
    return _pad([[1] * len(seq) for seq in seqs], 0)


def _lm_loss(
    lm: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[tuple[int, int]],
    batch_size: int,
    rng: random.Random,
) -> torch.Tensor:
    """Next-token loss on the answer and EOS of ``batch_size`` random train problems."""
    seqs, labels = [], []
    for _ in range(batch_size):
        a, b = rng.choice(problems)
        prompt = tokenizer.encode(arith_prompt(a, b), add_special_tokens=False)
        target = tokenizer.encode(arith_ground_truth(a, b), add_special_tokens=False)
        target = target + [int(tokenizer.eos_token_id)]
        seqs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    ids = _pad(seqs, int(tokenizer.pad_token_id))
    out = lm(input_ids=ids, attention_mask=_mask(seqs), labels=_pad(labels, -100))
    return out.loss  # type: ignore[no-any-return]


def _classifier_loss(
    classifier: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[tuple[int, int]],
    batch_size: int,
    rng: random.Random,
) -> torch.Tensor:
    """Binary cross-entropy of the score logit: right sums 1, wrong responses 0 (half each)."""
    import torch

    seqs, targets = [], []
    for _ in range(batch_size):
        a, b = rng.choice(problems)
        right = rng.random() < 0.5
        response = arith_ground_truth(a, b) if right else wrong_response(a, b, rng)
        seqs.append(tokenizer.encode(arith_prompt(a, b) + response, add_special_tokens=False))
        targets.append(1.0 if right else 0.0)
    ids = _pad(seqs, int(tokenizer.pad_token_id))
    logits = classifier(input_ids=ids, attention_mask=_mask(seqs)).logits[:, 0]
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(targets))
