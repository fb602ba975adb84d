"""Sampling for the Tinker-compatible service: completions of one prompt from the tenant model
with one adapter (or none: the base) active, with the log-prob of each sampled token, and the
log-probs of a prompt's own tokens (the SDK's ``compute_logprobs``).

All ``num_samples`` rows share the prompt, so they run as one batch with no padding and one
KV cache; queued calls of one sampling session run together (``sample_many``: their prompts
left-padded, each call with its own parameters and seed). A token's log-prob is under the distribution it was drawn from before top-k/top-p
(the model's own at temperature 1, which is what the RL losses' ratio needs). Stops: token ids
(the stop token is kept, as the SDK expects) or strings (checked on the decoded completion; the
token that completes one is kept), each besides the model's EOS ids as vLLM does; none at all
(``[]``) stops not even at EOS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hybridflow.errors import BadRequest

if TYPE_CHECKING:
    import torch
    from torch import nn

MAX_SAMPLES = 64
MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class SampleParams:
    """The SDK's ``sampling_params``, checked."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()
    """Token ids that end a completion, besides EOS."""
    stop_strings: tuple[str, ...] = ()
    eos: bool = True
    """Whether the model's EOS ids end a completion (not for ``stop: []``)."""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SampleParams:
        stop = raw.get("stop")
        stop_ids: tuple[int, ...] = ()
        strings: tuple[str, ...] = ()
        if isinstance(stop, str):
            strings = (stop,)
        elif isinstance(stop, list):
            if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
                stop_ids = tuple(stop)
            elif all(isinstance(s, str) for s in stop):
                strings = tuple(stop)
            else:
                raise BadRequest("sampling_params.stop: strings or token ids, not both")
        elif stop is not None:
            raise BadRequest(f"sampling_params.stop: {stop!r}")
        max_tokens = raw.get("max_tokens")
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_NEW_TOKENS:
            raise BadRequest(f"sampling_params.max_tokens must be in [1, {MAX_NEW_TOKENS}]")
        params = cls(
            max_tokens=max_tokens,
            temperature=float(raw.get("temperature", 1.0)),
            top_k=int(raw.get("top_k", -1)),
            top_p=float(raw.get("top_p", 1.0)),
            seed=raw.get("seed"),
            stop_ids=stop_ids,
            stop_strings=strings,
            eos=stop != [],
        )
        if params.temperature < 0 or not 0 < params.top_p <= 1 or params.top_k == 0:
            raise BadRequest("sampling_params: temperature >= 0, top_p in (0, 1], top_k -1 or >= 1")
        return params


@dataclass
class Completion:
    """One sampled sequence: its tokens, their log-probs, and whether a stop ended it."""

    tokens: list[int]
    logprobs: list[float]
    stopped: bool


@dataclass(frozen=True)
class SampleRequest:
    """One sample call: ``num_samples`` completions of ``prompt`` (token ids) under
    ``params``."""

    prompt: np.ndarray
    num_samples: int
    params: SampleParams


def check(model: nn.Module, request: SampleRequest) -> None:
    """BadRequest for a request the model cannot serve: too many samples, past its context."""
    if not 1 <= request.num_samples <= MAX_SAMPLES:
        raise BadRequest(f"num_samples must be in [1, {MAX_SAMPLES}], got {request.num_samples}")
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is not None and len(request.prompt) + request.params.max_tokens > limit:
        raise BadRequest(
            f"prompt of {len(request.prompt)} tokens + max_tokens {request.params.max_tokens} "
            f"is over the model's context of {limit}"
        )


def sample(
    model: nn.Module,
    prompt: np.ndarray,
    num_samples: int,
    params: SampleParams,
    eos_ids: set[int],
    decode: Callable[[list[int]], str],
) -> list[Completion]:
    """``num_samples`` completions of ``prompt`` (token ids) with ``model`` as it is."""
    request = SampleRequest(prompt, num_samples, params)
    check(model, request)
    return sample_many(model, [request], eos_ids, decode)[0]


def sample_many(
    model: nn.Module,
    requests: list[SampleRequest],
    eos_ids: set[int],
    decode: Callable[[list[int]], str],
) -> list[list[Completion]]:
    """Each request's completions, all in one batch with one KV cache (``check`` them
    first): prompts left-padded, each row's positions its own, each request drawing with its
    own parameters, stops and seed, until every row stopped or reached its ``max_tokens``.
    One request alone has no padding."""
    import torch

    rows = [(r, i) for r in requests for i in range(r.num_samples)]
    width = max(len(r.prompt) for r in requests)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for row, (request, _) in enumerate(rows):
        n = len(request.prompt)
        ids[row, width - n :] = torch.from_numpy(request.prompt.astype(np.int64))
        mask[row, width - n :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    groups, start = [], 0
    for request in requests:
        params = request.params
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        stops = set(params.stop_ids) | (eos_ids if params.eos else set())
        groups.append((slice(start, start + request.num_samples), params, stops, seed))
        start += request.num_samples
    generators = [torch.Generator().manual_seed(seed) for *_, seed in groups]
    out = [Completion([], [], False) for _ in rows]
    done = [False] * len(rows)
    with torch.no_grad():
        result = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        for step in range(max(r.params.max_tokens for r in requests)):
            logits = result.logits[:, -1].float()
            token = torch.zeros(len(rows), dtype=torch.long)
            for (rows_of, params, stops, _), generator in zip(groups, generators, strict=True):
                drawn, logprob = _draw(logits[rows_of], params, generator)
                token[rows_of] = drawn
                for offset, row in enumerate(range(rows_of.start, rows_of.stop)):
                    if done[row]:
                        continue
                    tok = int(drawn[offset])
                    out[row].tokens.append(tok)
                    out[row].logprobs.append(float(logprob[offset]))
                    if tok in stops or _ends_with_stop(out[row].tokens, params, decode):
                        out[row].stopped = done[row] = True
                    elif step + 1 >= params.max_tokens:
                        done[row] = True
            if all(done):
                break
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            result = model(
                input_ids=token.unsqueeze(1),
                attention_mask=mask,
                position_ids=positions,
                past_key_values=result.past_key_values,
                use_cache=True,
            )
    completions, start = [], 0
    for request in requests:
        completions.append(out[start : start + request.num_samples])
        start += request.num_samples
    return completions


def _draw(
    logits: torch.Tensor, params: SampleParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    if params.temperature == 0:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
    scaled = torch.log_softmax(logits / params.temperature, -1)
    masked = scaled.clone()
    if params.top_k > 0 and params.top_k < masked.shape[-1]:
        kth = masked.topk(params.top_k, dim=-1).values[:, -1:]
        masked[masked < kth] = -float("inf")
    if params.top_p < 1:
        sorted_lp, order = masked.sort(-1, descending=True)
        before = sorted_lp.softmax(-1).cumsum(-1) - sorted_lp.softmax(-1)
        sorted_lp[before >= params.top_p] = -float("inf")
        masked = torch.full_like(masked, -float("inf")).scatter(-1, order, sorted_lp)
    token = torch.multinomial(masked.softmax(-1), 1, generator=generator)[:, 0]
    return token, scaled.gather(-1, token[:, None])[:, 0]


def _ends_with_stop(
    tokens: list[int], params: SampleParams, decode: Callable[[list[int]], str]
) -> bool:
    if not params.stop_strings:
        return False
    text = decode(tokens)
    return any(s in text for s in params.stop_strings)


def prompt_logprobs(model: nn.Module, prompt: np.ndarray) -> np.ndarray:
    """The log-prob of each prompt token given the ones before it; NaN for the first."""
    import torch

    ids = torch.from_numpy(prompt.astype(np.int64)).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return np.concatenate([[np.nan], lp.numpy()]).astype(np.float32)
