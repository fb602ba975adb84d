"""Model loading for the learner: actor, frozen reference, critic (backbone + value head).

Everything loads through ``from_pretrained`` from a local checkpoint directory (a model spec
such as ``builtin:tiny`` is resolved by ``hybridflow.models.resolve_model_path``). Models are
kept in eval mode: RL log-probs must match the rollout engine's, so dropout stays off while
training. This module knows nothing about sharding, losses or ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hybridflow.models import resolve_model_path


def resolve_checkpoint(spec: str | Path) -> Path:
    """Checkpoint directory of a model spec (``builtin:tiny`` or a local directory)."""
    return resolve_model_path(str(spec))


def load_actor(
    path: Path, device: torch.device, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """The trainable causal LM, fp32 (or ``dtype``), on ``device``, in eval mode (no
    dropout)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    _to_device(model, device)
    model.eval()
    return model


def _to_device(module: nn.Module, device: torch.device) -> None:
    module.to(device)


def load_reference(
    path: Path, device: torch.device, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """A frozen copy of the initial actor (the KL reference), in ``dtype``."""
    model = load_actor(path, device, dtype)
    model.requires_grad_(False)
    return model


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer (saved alongside learner checkpoints)."""
    return AutoTokenizer.from_pretrained(path)


class ValueModel(nn.Module):
    """Critic: the actor's transformer backbone plus a scalar value head per position."""

    def __init__(self, backbone: PreTrainedModel, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Values ``[batch, seq]`` (fp32), one per position."""
        out: Any = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        return self.value_head(out.last_hidden_state).squeeze(-1).float()

    def decoder_layer_classes(self) -> set[str]:
        """Class names of the backbone's decoder blocks (FSDP wrapping units)."""
        return set(getattr(self.backbone, "_no_split_modules", None) or ())


def load_critic(path: Path, device: torch.device, seed: int) -> ValueModel:
    """Critic initialised from the actor checkpoint; the value head is seeded (std 0.02 normal,
    zero bias) so every rank builds the same head."""
    backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
    hidden_size = int(backbone.config.get_text_config().hidden_size)
    critic = ValueModel(backbone, hidden_size)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = torch.randn(critic.value_head.weight.shape, generator=generator) * 0.02
        critic.value_head.weight.copy_(weight)
        critic.value_head.bias.zero_()
    _to_device(critic, device)
    critic.eval()
    return critic


def decoder_layer_classes(model: nn.Module) -> set[str]:
    """Names of the classes FSDP wraps one by one (HF's ``_no_split_modules``)."""
    if isinstance(model, ValueModel):
        return model.decoder_layer_classes()
    return set(getattr(model, "_no_split_modules", None) or ())
