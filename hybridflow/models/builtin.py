"""The built-in ``builtin:tiny`` model: a small Llama with the character tokenizer, warm-started.

``ensure_builtin_model`` builds the checkpoint once per spec (seeded, deterministic), saves it as
an ordinary Hugging Face directory (config.json, model.safetensors, tokenizer files) and returns
its path; later calls return the cached directory. Real post-training starts from a pretrained
model, so the build ends with a short supervised warm start on the ``builtin:arith`` format:
the model learns "digits then EOS" and is unsure about the digits, which RL then sharpens.

The warm-start labels are noisy on purpose: each target is the true sum with probability
``label_correct_prob`` and otherwise a near miss (off by 1..``label_max_offset``). Trained to
convergence, the model's sampled (temperature 1) accuracy sits near that probability while the
true sum stays its most likely answer, a calibrated start that does not hinge on stopping SFT
at an exact step.

The built-in reward model ``builtin:tiny-rm`` (``builtin_rm.py``) is cached the same way.

Concurrent callers (several services on one machine) are serialised by a file lock; the
directory appears by an atomic rename, so no caller ever sees a half-written checkpoint.

This module knows nothing about services, RL or rewards.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hybridflow.data.arith import DEFAULT_MAX_OPERAND, arith_ground_truth, arith_prompt
from hybridflow.models.builtin_rm import REWARD_SPECS, RewardModelSpec, build_reward_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

BUILD_FORMAT_VERSION = 1
"""Bump when the build procedure changes in a way the spec fields do not capture."""


@dataclass(frozen=True)
class BuiltinSpec:
    """Everything that determines a built-in checkpoint; its hash names the cache directory."""

    hidden_size: int = 64
    """Model width."""
    intermediate_size: int = 256
    """MLP width."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 2
    """Attention heads (also the key/value heads: no grouped-query attention). Two heads of 32:
    vLLM's CPU attention needs head_dim >= 32, and two heads still split over two TP ranks."""
    max_position_embeddings: int = 128
    """Longest sequence the rotary embedding is configured for."""
    init_seed: int = 0
    """Seed of the weight initialisation and of the warm-start data."""
    max_operand: int = DEFAULT_MAX_OPERAND
    """Warm-start problems use operands 0..max_operand, like ``builtin:arith``."""
    warmup_batch_size: int = 64
    """Problems per warm-start step (both phases)."""
    clean_steps: int = 500
    """Phase 1: supervised steps on true sums (the model learns the format and the task)."""
    clean_lr: float = 3e-3
    """AdamW learning rate of phase 1."""
    noisy_steps: int = 200
    """Phase 2: supervised steps on noisy labels (the model becomes unsure of the digits)."""
    noisy_lr: float = 3e-4
    """AdamW learning rate of phase 2 (low, so the true sum mostly stays the likeliest)."""
    label_correct_prob: float = 0.4
    """Phase 2: probability that a target is the true sum (else a near miss)."""
    label_max_offset: int = 2
    """Phase 2: near misses are the sum plus or minus 1..label_max_offset (never negative)."""


SPECS: dict[str, BuiltinSpec] = {
    "tiny": BuiltinSpec(),
    "tiny-random": BuiltinSpec(clean_steps=0, noisy_steps=0),
}
"""Built-in model names and their specs. ``tiny-random`` is ``tiny`` without the warm start
(the seeded random initialisation): the cold-start comparison of the algorithm suite."""


def builtin_names() -> list[str]:
    """Every built-in model name: policies (``SPECS``) and reward models (``REWARD_SPECS``)."""
    return sorted({*SPECS, *REWARD_SPECS})


def spec_hash(spec: BuiltinSpec | RewardModelSpec) -> str:
    """Short stable hash of a spec and the build format version."""
    payload = json.dumps({"v": BUILD_FORMAT_VERSION, **asdict(spec)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def default_models_root() -> Path:
    """``$HYBRIDFLOW_HOME/models`` when set, else ``~/.cache/hybridflow/models``."""
    home = os.environ.get("HYBRIDFLOW_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "hybridflow"
    return base / "models"


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def ensure_builtin_model(name: str = "tiny", root: str | Path | None = None) -> Path:
    """Path of the built-in model ``name``, building it under ``root`` on first use."""
    spec: BuiltinSpec | RewardModelSpec
    if name in SPECS:
        spec = SPECS[name]
    elif name in REWARD_SPECS:
        spec = REWARD_SPECS[name]
    else:
        raise ValueError(f"unknown builtin model {name!r}; known: {builtin_names()}")
    models_root = Path(root) if root is not None else default_models_root()
    target = models_root / f"{name}-{spec_hash(spec)}"
    if _is_complete(target):
        return target
    models_root.mkdir(parents=True, exist_ok=True)
    lock_path = models_root / f".{target.name}.lock"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if _is_complete(target):
                return target
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=models_root))
            try:
                if isinstance(spec, RewardModelSpec):
                    build_reward_checkpoint(spec, tmp)
                else:
                    build_checkpoint(spec, tmp)
                # mkdtemp makes the directory private; the cache is meant to be readable.
                for child in tmp.iterdir():
                    child.chmod(0o644)
                tmp.chmod(0o755)
                if target.exists():
                    # A leftover from an interrupted build without config.json: replace it.
                    shutil.rmtree(target)
                os.rename(tmp, target)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return target


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


def build_checkpoint(spec: BuiltinSpec, out_dir: Path) -> None:
    """Initialise, warm-start and save the model and tokenizer of ``spec`` into ``out_dir``.

    The caller's global torch RNG state is left untouched.
    """
    import torch
    from transformers import LlamaForCausalLM

    from hybridflow.models.tiny_llama import tiny_llama_config
    from hybridflow.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = tiny_llama_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        model = LlamaForCausalLM(config).float()
        _supervised_steps(model, tokenizer, spec, spec.clean_steps, spec.clean_lr, 1.0)
        _supervised_steps(
            model, tokenizer, spec, spec.noisy_steps, spec.noisy_lr, spec.label_correct_prob
        )
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _supervised_steps(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    spec: BuiltinSpec,
    num_steps: int,
    lr: float,
    correct_prob: float,
) -> None:
    """``num_steps`` AdamW steps on arithmetic examples; loss on the answer and EOS only."""
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
            a, b = rng.randint(0, spec.max_operand), rng.randint(0, spec.max_operand)
            prompt, target = warmup_example(a, b, correct_prob, spec.label_max_offset, rng)
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
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
