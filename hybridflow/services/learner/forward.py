"""Forward passes of the learner over a ``PaddedBatch``: response log-probs, entropies, values.

The log-prob numerics follow the contract shared with the rollout engine:
``log_softmax(logits / T)`` at each response token, with the logits taken at the position
before it. Only the response positions are gathered before the softmax (cheaper for big
vocabularies). This module knows nothing about losses, optimizers or ranks.

Three memory tools of ``learner.memory`` live here:

* a shared-prompt batch (``shared_prompts``) reaches the model with its 4-D mask in the
  form the model's attention takes (``model_mask``); ``prompt_sharing`` says which models
  can take one at all;
* a packed batch (``packing``) reaches the model as one row with no attention mask: its
  position ids, restarting at 0 for each sequence, are what transformers reads to keep
  attention within each sequence (``masking_utils.find_packed_sequence_indices`` for sdpa
  and eager attention, varlen kernels for flash attention);
* the output head runs on the response positions only (as TRL's ``logits_to_keep``): a
  prompt position's ``[vocab]`` logits are never computed. At the 0.5B shape (a 151,936-word
  vocabulary) the head is a quarter of the model's FLOPs per position, and a GRPO batch's
  prompts are most of its positions. ``learner.memory.full_logits`` computes them all, as the
  model's own forward does (and a model that post-processes its logits after the head,
  Gemma 2's soft-capping, always does);
* ``logprob_chunk_tokens > 0``: the response positions' head runs ``chunk`` tokens at a time, each chunk's head + log-softmax + gather (+ entropy) under
  ``torch.utils.checkpoint``, so no more than one chunk's ``[chunk, vocab]`` logits exists at
  once, in the forward or the backward. The head is swapped for the call (as router replay
  swaps routers), so all of it runs inside the root module's call: under FSDP2 the root's
  parameters (head, embeddings, final norm) are unsharded there, and its backward hooks see
  the outputs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hybridflow.algorithms.entropy import entropy_from_logits
from hybridflow.algorithms.logprobs import effective_temperature, logprobs_from_logits
from hybridflow.models.router_replay import replay_routing
from hybridflow.services.learner.batching import PaddedBatch, PromptSharing


def policy_forward(
    model: nn.Module,
    batch: PaddedBatch,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int | None = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs, entropy)`` of the response tokens, each ``[rows, resp]`` fp32.

    Entropy (of the temperature-scaled distribution) is None unless ``with_entropy``.
    Padded response slots hold meaningless values; callers mask them. A batch carrying
    ``routed_experts`` is run with the model's MoE routers replaying them.
    ``chunk_tokens``: None computes the logits at every position (``full_logits``); 0 runs
    the head on the response positions at once; ``> 0`` that many response tokens at a time
    under recomputation (``learner.memory.logprob_chunk_tokens``; see the module doc).
    """
    t = effective_temperature(temperature)
    if chunk_tokens == 0 and not has_plain_head(model):
        chunk_tokens = None  # logits post-processed after the head: the model's own forward
    if chunk_tokens is not None:
        with _chunked_head(model, batch, t, with_entropy, chunk_tokens):
            scores = _run(model, batch).logits
        entropy = scores[..., 1] if with_entropy else None
        return scores[..., 0], entropy
    logits = _run(model, batch).logits
    if batch.packed or batch.shared:
        gathered = logits.reshape(-1, logits.shape[-1])[batch.flat_response_index()]
    else:
        index = batch.response_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        gathered = logits.gather(1, index)
    scaled = gathered.float() / t
    logprobs = logprobs_from_logits(scaled, batch.response_ids, 1.0)
    entropy = entropy_from_logits(scaled) if with_entropy else None
    return logprobs, entropy


def value_forward(critic: nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """Critic values ``[rows, resp]``: the value of the state before each response token."""
    values = critic(batch.input_ids, model_mask(critic, batch), batch.position_ids)
    if batch.packed or batch.shared:
        return values.reshape(-1)[batch.flat_response_index()]
    return values.gather(1, batch.response_index)


def _run(model: nn.Module, batch: PaddedBatch) -> Any:
    with replay_routing(model, batch.routed_experts):
        return model(
            input_ids=batch.input_ids,
            attention_mask=model_mask(model, batch),
            position_ids=batch.position_ids,
            use_cache=False,
        )


def model_mask(model: nn.Module, batch: PaddedBatch) -> torch.Tensor | None:
    """The ``attention_mask`` the model gets: none for a packed batch; a shared-prompt batch's
    4-D mask as sdpa takes it (bool) or as eager attention adds it (0 or the dtype's minimum);
    else the ``[rows, seq]`` padding mask."""
    if batch.packed:
        return None
    if not batch.shared:
        return batch.attention_mask
    if attention_implementation(model) == "sdpa":
        return batch.attention_mask
    first = next(iter(model.parameters()), None)
    # AdaptersOff registers no parameters: its actor's dtype
    dtype = first.dtype if first is not None else getattr(model, "dtype", torch.float32)
    blocked = torch.zeros(batch.attention_mask.shape, dtype=dtype, device=batch.input_ids.device)
    return blocked.masked_fill_(~batch.attention_mask, torch.finfo(dtype).min)


def attention_implementation(model: nn.Module) -> str | None:
    """The transformers attention the model runs (``"sdpa"``, ``"eager"``, a flash kernel)."""
    for module in (model, *model.modules()):
        config = getattr(module, "config", None)
        impl = getattr(config, "_attn_implementation", None)
        if isinstance(impl, str):
            return impl
    return None


def prompt_sharing(*models: nn.Module) -> PromptSharing | None:
    """When these models (a rank's actor and critic) can all run shared-prompt rows
    (``build_batch``'s ``sharing``), with the tightest bound: None where one's attention
    takes no 4-D mask (flash kernels, flex); rows bounded by the sliding window where a
    layer has one (the 4-D mask replaces the model's own, so sharing holds only while no
    sequence is longer than the window)."""
    found = [_model_sharing(m) for m in models]
    usable = [s for s in found if s is not None]
    if not usable or len(usable) < len(found):
        return None
    return min(usable, key=lambda s: s.max_len)


def _model_sharing(model: nn.Module) -> PromptSharing | None:
    """``prompt_sharing`` of one model."""
    if attention_implementation(model) not in ("sdpa", "eager"):
        return None
    for module in (model, *model.modules()):
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "get_text_config"):
            continue
        text = config.get_text_config()
        window = getattr(text, "sliding_window", None)
        layer_types = getattr(text, "layer_types", None)
        if layer_types is not None:
            slides = any("sliding" in str(kind) for kind in layer_types)
        else:
            slides = bool(getattr(text, "use_sliding_window", True))
        max_len = int(window) if slides and window else sys.maxsize
        return PromptSharing(max_len=max_len, hidden_size=int(text.hidden_size))
    return None


def has_plain_head(model: nn.Module) -> bool:
    """Whether the head's output is the logits (``output_head`` would take it)."""
    try:
        output_head(model)
    except ValueError:
        return False
    return True


def output_head(model: nn.Module) -> nn.Module:
    """The head the chunked log-probs swap; ValueError where chunking would compute something
    else (no head, or logits post-processed after it: Gemma 2's final soft-capping)."""
    where = "learner.memory.logprob_chunk_tokens"
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if not isinstance(head, nn.Module):
        raise ValueError(f"{where}: {type(model).__name__} has no output head")
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    if getattr(text, "final_logit_softcapping", None) is not None:
        raise ValueError(
            f"{where}: {type(model).__name__} soft-caps its logits after the head, which the "
            "chunked log-probs do not reproduce; leave the key at 0 for this model"
        )
    return head


@contextmanager
def _chunked_head(
    model: nn.Module, batch: PaddedBatch, temperature: float, with_entropy: bool, chunk: int
) -> Iterator[None]:
    """Within the block the model's output head returns ``[rows, resp, 2]`` (log-prob,
    entropy; entropy 0 unless ``with_entropy``) of the response tokens instead of logits;
    ``chunk`` 0: in one piece, with no recomputation."""
    head = output_head(model)
    original: Callable[[torch.Tensor], torch.Tensor] = head.forward
    index = batch.flat_response_index().reshape(-1)
    labels = batch.response_ids.reshape(-1)
    shape = (*batch.response_ids.shape, 2)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        states = hidden.reshape(-1, hidden.shape[-1])[index]
        if chunk == 0:
            return _chunk_scores(original, states, labels, temperature, with_entropy).reshape(shape)
        pieces = []
        for start in range(0, states.shape[0], chunk):
            args = (states[start : start + chunk], labels[start : start + chunk])
            if torch.is_grad_enabled():
                piece = checkpoint(
                    _chunk_scores, original, *args, temperature, with_entropy, use_reentrant=False
                )
            else:
                piece = _chunk_scores(original, *args, temperature, with_entropy)
            pieces.append(piece)
        return torch.cat(pieces).reshape(shape)

    own = "forward" in vars(head)
    head.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own:
            head.forward = original  # type: ignore[method-assign]
        else:
            del head.forward


def _chunk_scores(
    head: Callable[[torch.Tensor], torch.Tensor],
    states: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> torch.Tensor:
    """``[tokens, 2]``: log-prob of each label and entropy (0 unless ``with_entropy``)."""
    scaled = head(states).float() / temperature
    logprobs = logprobs_from_logits(scaled, labels, 1.0)
    entropy = entropy_from_logits(scaled) if with_entropy else torch.zeros_like(logprobs)
    return torch.stack([logprobs, entropy], dim=-1)
