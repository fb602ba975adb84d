"""The ``hf`` rollout engine: batched sampling with a KV cache over a transformers causal LM.

``HFEngine.generate`` expands every prompt ``n`` times, left-pads the batch, runs one prefill
forward and then one token per step through the model's ``DynamicCache``, drawing each token
with ``sampler.sample_tokens`` (temperature, top-k, top-p). It returns token ids, the per-token
log-prob ``log_softmax(logits / temperature)`` of each sampled token (before top-k and top-p
truncation), a finish reason and the policy
version of the weights that produced them. Position ids count real tokens only
(``cumsum(attention_mask) - 1``), so padding never changes a real token's output and the
learner's full forward over prompt+response reproduces the same log-probs.

A lock makes ``generate`` and ``load_weights`` mutually exclusive: a weight swap waits for the
request in flight and every completion of one request comes from one policy version.

This module sees token ids only: it never tokenizes text, knows no task, reward or transport.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hybridflow.arrays import FloatArray, TokenArray, as_tokens
from hybridflow.services.rollout.requests import Cancelled, ShouldStop, check_token_request
from hybridflow.services.rollout.sampler import sample_tokens
from hybridflow.types import Completion, SamplingParams

if TYPE_CHECKING:
    from hybridflow.lora.apply import AdapterTarget
    from hybridflow.lora.config import LoraConfig
    from hybridflow.resharding.layout import ReplicaLayout
    from hybridflow.weights.dist_receiver import DistReceiver
    from hybridflow.weights.spec import GroupSpec

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


PendingWeights = tuple[Sequence[tuple[str, torch.Tensor]] | None, int]
"""Named tensors and the policy version they belong to (None never reaches this engine)."""


class HFEngine:
    """One model copy on one device, sampling batches of completions for token-id prompts."""

    _adapters: AdapterTarget | None
    """With LoRA, the adapters syncs deliver (``lora.apply``); None: whole weights."""

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        lora: LoraConfig | None = None,
        lora_mode: str = "adapter",
    ) -> None:
        """``lora``: the learner's adapters (``learner.lora``): syncs then carry adapters
        only, applied as ``lora_mode`` says (``weight_sync.lora``: adapter | merged)."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise ValueError(f"model_path {str(path)!r} is not a checkpoint dir with config.json")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(path)
        self._setup(model, tokenizer, device, seed)
        if lora is not None and lora.enabled:
            from hybridflow.lora.apply import AdapterTarget

            self._adapters = AdapterTarget(self.model, lora, lora_mode)

    @classmethod
    def from_loaded(
        cls,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        device: str = "cpu",
        seed: int = 0,
    ) -> HFEngine:
        """An engine around an already-built model (tests use a fake one; no files are read)."""
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, device, seed)
        return engine

    def _setup(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        device: str,
        seed: int,
    ) -> None:
        self.device = torch.device(device)
        self.tokenizer = tokenizer
        # Typed as a PreTrainedModel for its call signature; a test fake only mimics that.
        self.model = cast(PreTrainedModel, model.to(self.device))
        self.model.eval()
        eos = tokenizer.eos_token_id
        if eos is None:
            eos = self.model.config.eos_token_id
        if isinstance(eos, list):
            eos = eos[0]
        if eos is None:
            raise ValueError("model: neither the tokenizer nor the config has an EOS token id")
        self.eos_token_id: int = int(eos)
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad) if pad is not None else self.eos_token_id
        embeddings = cast(torch.nn.Embedding, self.model.get_input_embeddings())
        self.vocab_size: int = int(embeddings.num_embeddings)
        self.policy_version: int = 0
        self.tensor_parallel_size = 1
        self._receiver: DistReceiver | None = None
        self.between_steps: Callable[[], PendingWeights | None] | None = None
        """Called between decode steps; new weights it returns are applied mid-request (the
        in-flight sequences continue on them, with per-token versions)."""
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lock = threading.Lock()
        self._adapters = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def dead_reason(self) -> None:
        """Always None: the model runs in this process, with no worker process to lose."""
        return None

    def on_dead(self, callback: Callable[[str], None]) -> None:
        """A no-op: with no worker process, this engine never dies on its own."""

    def close(self) -> None:
        """A no-op: the engine holds nothing beyond this process's memory."""

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompts: Sequence[TokenArray],
        params: SamplingParams,
        should_stop: ShouldStop | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` completions for each prompt (outer list: prompts, in order).
        ``should_stop`` is polled before every decode step; when it says so the request ends
        at once with ``Cancelled`` (its tokens are dropped)."""
        check_token_request(prompts, params, self.vocab_size)
        if params.return_routed_experts:
            raise ValueError(
                "sampling.return_routed_experts: the hf engine does not report routed experts "
                "(it routes as the learner does; router replay is for rollout.engine=vllm)"
            )
        if not prompts:
            return []
        with self._lock:
            generator = self._generator
            if params.seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(params.seed)
            tokens, logprobs, stopped, step_versions = self._generate_locked(
                prompts, params, generator, should_stop
            )
        version = step_versions[0]
        mixed = len(set(step_versions)) > 1
        versions = np.asarray(step_versions, dtype=np.int32)
        results: list[list[Completion]] = []
        for p in range(len(prompts)):
            group = []
            for j in range(params.n):
                row = p * params.n + j
                group.append(
                    Completion(
                        token_ids=tokens[row],
                        logprobs=logprobs[row],
                        finish_reason="stop" if stopped[row] else "length",
                        policy_version=version,
                        token_versions=versions[: tokens[row].size] if mixed else None,
                    )
                )
            results.append(group)
        return results

    @torch.no_grad()
    def _generate_locked(
        self,
        prompts: Sequence[TokenArray],
        params: SamplingParams,
        generator: torch.Generator,
        should_stop: ShouldStop | None = None,
    ) -> tuple[list[TokenArray], list[FloatArray], list[bool], list[int]]:
        num_rows = len(prompts) * params.n
        out, attention_mask = self._prefill(prompts, params.n)
        next_position = attention_mask.sum(dim=1, keepdim=True)
        stop_ids = torch.tensor(
            sorted({self.eos_token_id, *params.stop_token_ids}), device=self.device
        )
        # A row is finished once it drew EOS or a stop token; rows that reach max_new_tokens
        # without one stay unfinished and end with finish_reason "length".
        finished = torch.zeros(num_rows, dtype=torch.bool, device=self.device)
        step_tokens: list[torch.Tensor] = []
        step_logprobs: list[torch.Tensor] = []
        step_active: list[torch.Tensor] = []
        step_versions: list[int] = []
        for step in range(params.max_new_tokens):
            if should_stop is not None and should_stop():
                raise Cancelled(step)
            step_versions.append(self.policy_version)  # the weights that made these logits
            token, logprob = sample_tokens(
                out.logits[:, -1, :], params.temperature, params.top_p, generator, params.top_k
            )
            active = ~finished
            step_tokens.append(token)
            step_logprobs.append(logprob)
            step_active.append(active)
            finished |= torch.isin(token, stop_ids) & active
            if bool(finished.all()) or step == params.max_new_tokens - 1:
                break
            # Finished rows keep being fed (their outputs are discarded) so the batch stays
            # rectangular; their tokens never reach a completion.
            feed = torch.where(finished, torch.full_like(token, self.pad_token_id), token)
            pending = self.between_steps() if self.between_steps is not None else None
            if pending is not None and pending[0] is not None:
                self._apply_weights_locked(pending[0], pending[1])
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(num_rows, 1)], 1)
            out = self.model(
                input_ids=feed.unsqueeze(1),
                attention_mask=attention_mask,
                position_ids=next_position,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            next_position = next_position + 1

        all_tokens = torch.stack(step_tokens, dim=1).cpu().numpy().astype(np.int32)
        all_logprobs = torch.stack(step_logprobs, dim=1).cpu().float().numpy()
        lengths: list[int] = torch.stack(step_active, dim=1).sum(dim=1).cpu().tolist()
        tokens_out = [all_tokens[r, : lengths[r]] for r in range(num_rows)]
        logprobs_out = [all_logprobs[r, : lengths[r]] for r in range(num_rows)]
        return tokens_out, logprobs_out, finished.cpu().tolist(), step_versions

    def _prefill(self, prompts: Sequence[TokenArray], n: int) -> tuple[Any, torch.Tensor]:
        """Each prompt prefilled once (left-padded), then its cache (``out.past_key_values``),
        attention mask and last logits repeated for its ``n`` rows (row ``p * n + j``), as if
        every row had been prefilled: ``(output, attention_mask)``."""
        unique = [as_tokens(p) for p in prompts]
        max_len = max(r.size for r in unique)
        ids = np.full((len(unique), max_len), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(unique), max_len), dtype=np.int64)
        for i, r in enumerate(unique):
            ids[i, max_len - r.size :] = r
            mask[i, max_len - r.size :] = 1
        attention_mask = torch.from_numpy(mask).to(self.device)
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=torch.from_numpy(ids).to(self.device),
            attention_mask=attention_mask,
            position_ids=(attention_mask.cumsum(dim=1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        if n > 1:
            cache.batch_repeat_interleave(n)
            out.logits = out.logits.repeat_interleave(n, dim=0)
            attention_mask = attention_mask.repeat_interleave(n, dim=0)
        return out, attention_mask

    # ------------------------------------------------------------------ weights

    def check_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(model tensor, new tensor) pairs; ValueError naming the first bad name/shape/dtype.
        With LoRA: the adapters' check (every adapter, nothing else); no pairs."""
        if self._adapters is not None:
            self._adapters.check(named_tensors)
            return []
        state = self.model.state_dict()
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, tensor in named_tensors:
            if name not in state:
                raise ValueError(f"load_weights: unknown tensor {name!r} for this model")
            target = state[name]
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"load_weights: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"model expects {tuple(target.shape)}"
                )
            if not tensor.is_floating_point() and target.is_floating_point():
                raise ValueError(
                    f"load_weights: tensor {name!r} has non-float dtype {tensor.dtype}"
                )
            staged.append((target, tensor))
        return staged

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | None, policy_version: int
    ) -> None:
        """Copy the given tensors into the model (any subset of its state dict), atomically.

        Every name and shape is checked before anything is copied; a bad one raises
        ``ValueError`` naming the tensor and leaves the model and its version unchanged. The
        swap waits for an in-flight ``generate`` to finish.
        """
        if named_tensors is None:
            raise ValueError("load_weights: the hf engine stages no weights of its own")
        with self._lock:
            self._apply_weights_locked(named_tensors, policy_version)

    def weight_layout(self) -> ReplicaLayout:
        """Whole tensors under the learner's names (no family: any causal LM, TP 1); with
        LoRA, the adapters'."""
        from hybridflow.resharding.layout import layout_of
        from hybridflow.weights.dist_formation import replicated_topology

        return layout_of("", replicated_topology(self._weight_table()))

    def _weight_table(self) -> list[tuple[str, tuple[int, ...], str]]:
        from hybridflow.weights.dist_formation import param_table

        return param_table(self.model) if self._adapters is None else self._adapters.table

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str:
        """Joins the learner's weight-sync group as one destination rank (whole tensors)."""
        if self._receiver is None:
            from hybridflow.weights.dist_receiver import DistReceiver

            self._receiver = DistReceiver(self._weight_table(), self.device)
        return self._receiver.join(spec, replica_index)

    @torch.no_grad()
    def probe_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> FloatArray:
        """Log-probs of ``response_ids`` after ``prompt_ids`` under the current weights,
        temperature 1 (the delivery probe, ``weights/verify.py``); waits for a request in
        flight."""
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=self.device)
        if int(ids.max()) >= self.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"probe ids must lie in [0, {self.vocab_size})")
        with self._lock:
            logits = self.model(input_ids=ids, use_cache=False).logits[0].float()
        start = len(prompt_ids) - 1
        scores = torch.log_softmax(logits[start : start + len(response_ids)], dim=-1)
        picked = scores.gather(1, ids[0, len(prompt_ids) :].unsqueeze(1)).squeeze(1)
        return cast(FloatArray, picked.cpu().numpy())

    def receive_weights(self) -> tuple[list[tuple[str, torch.Tensor]], int]:
        """One sync over the group into fresh tensors: (tensors to stage, bytes received)."""
        if self._receiver is None:
            raise ValueError("no weight-sync group: call JoinWeightSync first")
        return self._receiver.receive()

    @torch.no_grad()
    def _apply_weights_locked(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> None:
        if self._adapters is not None:
            self._adapters.apply(list(named_tensors))
            self.policy_version = int(policy_version)
            return
        staged = self.check_weights(named_tensors)
        for target, tensor in staged:
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        self.policy_version = int(policy_version)
