"""Log-prob parity of a received TP-1 replica: the same fixed batch through a Hugging Face
Llama built from the learner's full weights and from the destination's fused tensors.

At TP 1 the destination's ``qkv_proj`` is ``cat([q, k, v])`` and ``gate_up_proj`` is
``cat([gate, up])`` (vLLM's layout, ``decoder_topology(fused=True)``); ``unfuse`` splits them back
into the Hugging Face names. This module knows the Llama layout; not ranks or transports.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.models.families import DecoderDims

BATCH, SEQ_LEN, SEED = 2, 16, 11


def unfuse(tensors: Mapping[str, torch.Tensor], dims: DecoderDims) -> dict[str, torch.Tensor]:
    """Hugging Face state dict from a TP-1 destination's (fused) tensors."""
    q, kv = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith("qkv_proj.weight"):
            base = name.removesuffix("qkv_proj.weight")
            for part, piece in zip(("q", "k", "v"), t.split([q, kv, kv])):
                out[f"{base}{part}_proj.weight"] = piece
        elif name.endswith("gate_up_proj.weight"):
            base = name.removesuffix("gate_up_proj.weight")
            gate, up = t.split([dims.intermediate, dims.intermediate])
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = gate, up
        else:
            out[name] = t
    return out


def batch_logprobs(state: Mapping[str, torch.Tensor], dims: DecoderDims) -> torch.Tensor:
    """Log-probs of a fixed seeded token batch, shape (BATCH, SEQ_LEN - 1), fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=dims.vocab, hidden_size=dims.hidden, intermediate_size=dims.intermediate,
        num_hidden_layers=dims.num_layers, num_attention_heads=dims.num_heads,
        num_key_value_heads=dims.num_kv_heads, head_dim=dims.head_dim,
        tie_word_embeddings=dims.tie_embeddings,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(dict(state), strict=not dims.tie_embeddings, assign=True)
    if dims.tie_embeddings:
        model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # off the meta device
    tokens = torch.randint(
        0, dims.vocab, (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(SEED)
    )
    with torch.no_grad():
        logits = model(tokens).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
