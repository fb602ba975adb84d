"""A LoRA actor's exports: the PEFT adapter directory and the merged full model.

``write_peft_dir`` writes what ``peft.PeftModel.from_pretrained`` and vLLM's LoRA loader
read: ``adapter_config.json`` and ``adapter_model.safetensors`` (tensors under PEFT's names).
``merged_items`` turns the injected model's full state dict (``...q_proj.base_layer.weight``
and its adapter) into the plain Hugging Face one with ``W + scale * B @ A``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from hybridflow.lora.config import LoraConfig
from hybridflow.lora.names import merged, peft_file_name, wire_name_of_peft_param


def peft_config_dict(config: LoraConfig, base_model: str) -> dict[str, object]:
    """``adapter_config.json`` of these adapters (PEFT's keys; vLLM reads the same file)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": sorted(config.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }


def write_peft_dir(
    directory: Path,
    adapters: Sequence[tuple[str, torch.Tensor]],
    config: LoraConfig,
    base_model: str,
) -> Path:
    """Writes the adapter directory (a fresh one replaces an old one by rename); returns it."""
    from safetensors.torch import save_file

    directory = Path(directory)
    partial = directory.with_name(directory.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    tensors = {peft_file_name(n): t.detach().contiguous().cpu() for n, t in adapters}
    save_file(tensors, str(partial / "adapter_model.safetensors"))
    (partial / "adapter_config.json").write_text(
        json.dumps(peft_config_dict(config, base_model), indent=2) + "\n"
    )
    if directory.exists():  # a re-export: the old one goes just before the new one lands
        shutil.rmtree(directory)
    os.replace(partial, directory)
    return directory


def merged_items(
    items: Iterable[tuple[str, torch.Tensor]], scale: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain HF state dict of an injected model's full state dict: each adapted
    layer's weight merged with its adapter, under the layer's own name. Adapter tensors
    follow their base weight in module order; a layer is emitted once both are seen."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        wire = wire_name_of_peft_param(name)
        if wire is None and ".base_layer." not in name:
            yield name, tensor
            continue
        if wire is None:  # ...q_proj.base_layer.weight (or .bias)
            layer, _, leaf = name.partition(".base_layer.")
            if leaf != "weight":
                yield f"{layer}.{leaf}", tensor
                continue
            key = "W"
        else:
            layer, _, half = wire.rpartition(".lora_")
            key = half.split(".")[0]  # "A" or "B"
        parts = pending.setdefault(layer, {})
        parts[key] = tensor
        if len(parts) == 3:
            del pending[layer]
            yield f"{layer}.weight", merged(parts["W"], parts["A"], parts["B"], scale)
    if pending:
        raise ValueError(f"adapted layers missing a part: {sorted(pending)[:3]}")
