"""Random-init checkpoints with a real model's exact dims: ``builtin:qwen2.5-0.5b-shape``.

They test what happens at the sizes users train (memory, weight sync, step time) without a
download: the config is the real model's, the weights a seeded random init, the tokenizer
the one of ``builtin:tiny-qwen3`` (byte-level BPE with ChatML, built locally), whose ids all
fit the real vocabulary. Nothing learns anything useful from them; they are for measuring.

Built on first use into the model cache (``$HYBRIDFLOW_HOME/models``), under a lock, by way
of a temp dir and a rename; the directory is named by a hash of the shape, so a changed
shape is a new directory. The weights are saved in bf16 (half the disk; the learner and the
rollout cast to their own dtype on load). Never shipped: at 0.5B parameters they are a
gigabyte. This module imports torch and transformers only inside ``build_shape_model``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COMPLETE = "SHAPE_COMPLETE"
"""Written last into a built directory: one without it is a partial build, rebuilt."""


@dataclass(frozen=True)
class ModelShape:
    """A real checkpoint's architecture: its ``model_type`` and config dims, and the seed of
    the random init."""

    model_type: str
    """The transformers family (``qwen2``)."""
    dims: dict[str, Any] = field(default_factory=dict)
    """Config keys of the real checkpoint (``hidden_size``, ``num_hidden_layers``, ...)."""
    init_seed: int = 0
    """Seed of the weight initialisation."""
    tokenizer_from: str = "tiny-qwen3"
    """The built-in whose tokenizer files are copied (its ids must fit ``vocab_size``)."""

    def digest(self) -> str:
        """12 hex digits naming the shape's cache directory."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def num_parameters(self) -> int:
        """Parameters of a decoder of these dims (tied embeddings counted once)."""
        d = self.dims
        hidden, layers, vocab = d["hidden_size"], d["num_hidden_layers"], d["vocab_size"]
        head_dim = d.get("head_dim") or hidden // d["num_attention_heads"]
        q = d["num_attention_heads"] * head_dim
        kv = d["num_key_value_heads"] * head_dim
        attention = hidden * (q + 2 * kv) + q * hidden
        if d.get("qkv_bias", self.model_type == "qwen2"):
            attention += q + 2 * kv
        mlp = 3 * hidden * d["intermediate_size"]
        norms = 2 * hidden
        embed = vocab * hidden * (1 if d.get("tie_word_embeddings", False) else 2)
        return layers * (attention + mlp + norms) + embed + hidden


QWEN25_05B = ModelShape(
    model_type="qwen2",
    dims={
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
    },
)
"""Qwen/Qwen2.5-0.5B-Instruct's config.json dims (494M parameters, q/k/v biases)."""

SHAPES: dict[str, ModelShape] = {"qwen2.5-0.5b-shape": QWEN25_05B}
"""``builtin:<name>`` shape models."""


def ensure_shape_model(name: str, root: str | Path | None = None) -> Path:
    """The directory of shape model ``name`` in the cache, built there on first use."""
    from hybridflow.models.builtin import default_models_root

    if name not in SHAPES:
        raise ValueError(f"unknown shape model {name!r}; known: {sorted(SHAPES)}")
    shape = SHAPES[name]
    models_root = Path(root) if root is not None else default_models_root()
    target = models_root / f"{name}-{shape.digest()}"
    if (target / COMPLETE).is_file():
        return target
    models_root.mkdir(parents=True, exist_ok=True)
    with open(models_root / f".{target.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if not (target / COMPLETE).is_file():
                log.info("building builtin:%s (random init, %s params) in %s", name,
                         f"{shape.num_parameters() / 1e6:.0f}M", target)  # fmt: skip
                _build_into(shape, models_root, target)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return target


def _build_into(shape: ModelShape, models_root: Path, target: Path) -> None:
    from hybridflow.models.builtin import move_into_place

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=models_root))
    try:
        build_shape_model(shape, tmp)
        (tmp / COMPLETE).write_text(shape.digest() + "\n")
        move_into_place(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def shape_config(shape: ModelShape, tokenizer: Any) -> Any:
    """The transformers config of ``shape`` with the tokenizer's special ids."""
    from transformers import AutoConfig

    if len(tokenizer) > shape.dims["vocab_size"]:
        raise ValueError(
            f"tokenizer of builtin:{shape.tokenizer_from} has {len(tokenizer)} ids, over the "
            f"shape's vocab_size {shape.dims['vocab_size']}"
        )
    dims = {k: v for k, v in shape.dims.items() if k != "qkv_bias"}
    return AutoConfig.for_model(
        shape.model_type,
        **dims,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_shape_model(shape: ModelShape, out_dir: Path) -> None:
    """Seeded random init of ``shape``, saved (bf16) with its tokenizer into ``out_dir``.
    The caller's global torch RNG state is left untouched."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.models.builtin import ensure_builtin_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_builtin_model(shape.tokenizer_from))
    config = shape_config(shape, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(shape.init_seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
