"""Methods added to every vLLM worker process (``worker_extension_cls``): weights in and out.

vLLM builds one worker per tensor-parallel rank and mixes this class into it; the engine
calls these methods on every rank at once with ``collective_rpc``. A worker here

- describes the weights it takes in the learner's (Hugging Face) names (``hf_param_table``),
  from its model family (``hybridflow.models.families``), once that description is checked
  against the parameters its model really holds (``hf_check_engine_params``, again at join);
- loads a whole checkpoint handed to it (``hf_load_weights``: the gRPC and in-process paths);
- joins the torch.distributed weight-sync group as its own destination rank and receives
  only its slices along the resharding plan (``hf_join_weight_sync``, ``hf_receive_weights``),
  staging them until the engine applies them between two decode steps (``hf_apply_staged``).

Weights always go in through vLLM's in-place reload (``Worker.reload_weights``): on CPU vLLM
repacks linear weights for its kernels after loading, so writing into parameters directly
would leave the kernels on the old weights; the reload runs vLLM's own loaders and repacking.
Slices already cut for this rank are loaded with vLLM's linear loaders told to take them as
they are (``_presharded_linears``); vocabulary-parallel and FusedMoE expert slices sit in
their place in an uninitialised full-size buffer (only that place is ever touched), since
vLLM's embedding and expert loaders cut their part out of the full tensor themselves.

This module runs inside vLLM's processes: it knows vLLM's worker, nothing of gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import astuple
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hybridflow.errors import DeliveryFailed
from hybridflow.models.families import DecoderDims, ModelFamily, family_of_config
from hybridflow.resharding.coverage import check_same_params
from hybridflow.resharding.layout import layout_of
from hybridflow.services.rollout.vllm_idle import shorten_idle_spin
from hybridflow.services.rollout.vllm_routing import RoutingCaptureWorker
from hybridflow.utils.malloc import keeps_large_blocks
from hybridflow.weights.dist_receiver import DistReceiver
from hybridflow.weights.spec import GroupSpec

TableRow = tuple[str, tuple[int, ...], str]

# vLLM imports this module in each worker process (``worker_extension_cls``) before the
# worker builds its message queue: its reader then sleeps soon after a generation instead of
# spinning on a core for a second (vllm_idle.py).
shorten_idle_spin()


class WeightSyncWorker(RoutingCaptureWorker):
    """Mixin for vLLM's worker: ``self`` is the worker (``model_runner``, ``rank``, ...).
    It also records mixture-of-experts routing on request (``vllm_routing``)."""

    model_config: Any
    model_runner: Any
    parallel_config: Any
    rank: int
    device: torch.device

    if TYPE_CHECKING:  # vLLM's Worker has it; defining it here would clash with vLLM's check

        def reload_weights(self, *args: Any, **kwargs: Any) -> None: ...

    # ------------------------------------------------------------------ description

    def _hf_family(self) -> ModelFamily:
        return family_of_config(self.model_config.hf_config)

    def _hf_dims(self) -> DecoderDims:
        dtype = str(self.model_config.dtype).removeprefix("torch.")
        return self._hf_family().dims(self.model_config.hf_config, dtype)

    def hf_param_table(self) -> list[TableRow]:
        """(name, global shape, dtype) of the learner's parameters, sorted by name, once the
        family's description is checked against what this worker's model holds."""
        self.hf_check_engine_params(self.parallel_config.tensor_parallel_size)
        params = self._hf_family().topology(self._hf_dims(), fused=False).params
        return sorted((p.name, p.shape, p.dtype) for p in params)

    def hf_check_engine_params(self, tp_size: int) -> None:
        """ValueError naming every parameter the model holds that the family's topology does
        not fill, or that the topology names and the model lacks (or shapes otherwise)."""
        family = self._hf_family()
        planned = family.engine_param_shapes(self._hf_dims(), tp_size)
        held = engine_param_shapes(self.model_runner.get_model())
        check_same_params(
            planned,
            held,
            f"vLLM's {family.model_type} model (TP rank {self.rank})",
            "keep its old values",
        )

    def hf_weight_layout(self) -> tuple[str, list[tuple[Any, ...]], str]:
        """(family, one row per learner parameter) of how this worker places the weights:
        the family of the config this worker's model was built from, at this TP size, once
        checked against the parameters the model holds (the learner compares it at join)."""
        self.hf_check_engine_params(self.parallel_config.tensor_parallel_size)
        family = self._hf_family()
        layout = layout_of(family.model_type, family.sliced_topology(self._hf_dims()))
        return layout.family, [astuple(p) for p in layout.params], layout.dtype

    def hf_keeps_freed_memory(self) -> bool | None:
        """Whether this worker's allocator keeps large blocks in its heap (the tunables
        ``vllm_runtime`` starts it with); None where that cannot be told (not glibc)."""
        return keeps_large_blocks()

    # ------------------------------------------------------------------ whole checkpoints

    def hf_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> list[str]:
        """Reload from whole (unsharded) tensors; vLLM cuts this rank's part itself. The
        parameters vLLM's loaders left unloaded (``_reload``)."""
        return self._reload(self._with_tied_head(named_tensors), sharded=False)

    # ------------------------------------------------------------------ weight-sync group

    def hf_join_weight_sync(
        self, spec: dict[str, Any], replica_index: int, lora_table: list[TableRow] | None = None
    ) -> str:
        """Join the group as destination rank (replica_index, this TP rank); the plan hash.
        ``lora_table``: receive these LoRA adapter tensors, each whole, instead."""
        receiver = getattr(self, "_hf_receiver", None)
        self.hf_check_engine_params(int(spec["replica_tp_sizes"][replica_index]))
        if receiver is None and lora_table is not None:
            table = [(n, tuple(shape), d) for n, shape, d in lora_table]
            receiver = DistReceiver(table, self.device, tp_rank=self.rank, whole=True)
            self._hf_receiver = receiver
        elif receiver is None:
            sliced = self._hf_family().sliced_topology(self._hf_dims())
            receiver = DistReceiver(
                self.hf_param_table(), self.device, tp_rank=self.rank, sliced=sliced
            )
            self._hf_receiver = receiver
        self._hf_staged: list[tuple[str, torch.Tensor]] | None = None
        group_spec = GroupSpec(**{**spec, "replica_tp_sizes": tuple(spec["replica_tp_sizes"])})
        return receiver.join(group_spec, replica_index)

    def hf_receive_weights(self) -> int | str:
        """Receive this rank's slices of one sync into staging; returns the bytes received,
        or, when a slice did not arrive as sent (``DeliveryFailed``), the check's message
        (an exception's type does not survive vLLM's collective RPC)."""
        receiver = getattr(self, "_hf_receiver", None)
        if receiver is None:
            raise ValueError("no weight-sync group: call JoinWeightSync first")
        try:
            tensors, num_bytes = receiver.receive()
        except DeliveryFailed as exc:
            return str(exc)
        self._hf_staged = tensors
        return num_bytes

    def hf_apply_staged(self) -> list[str]:
        """Load what the last ``hf_receive_weights`` staged; the parameters vLLM's loaders
        left unloaded (``_reload``)."""
        staged = getattr(self, "_hf_staged", None)
        if staged is None:
            raise ValueError("no staged weights to apply")
        receiver: DistReceiver = self._hf_receiver
        sharded = receiver.tp_size > 1
        tensors = self._in_full_size(staged, receiver) if sharded else staged
        self._hf_staged = None
        return self._reload(self._with_tied_head(tensors), sharded=sharded)

    # ------------------------------------------------------------------ LoRA adapters

    def hf_write_staged_adapter(self, directory: str, config: dict[str, Any]) -> None:
        """TP rank 0 writes the adapter the last receive staged (whole tensors, the same on
        every rank) as a PEFT directory for vLLM's LoRA loader; every rank drops it."""
        staged = getattr(self, "_hf_staged", None)
        if staged is None:
            raise ValueError("no staged adapter to write")
        self._hf_staged = None
        if self.rank == 0:
            from hybridflow.lora.config import LoraConfig
            from hybridflow.lora.export import write_peft_dir

            lora = LoraConfig(
                rank=int(config["r"]),
                alpha=float(config["lora_alpha"]),
                target_modules=list(config["target_modules"]),
            )
            write_peft_dir(Path(directory), staged, lora, str(config["base_model_name_or_path"]))

    def hf_merge_adapters(self, named: list[tuple[str, torch.Tensor]] | None, scale: float) -> None:
        """``weight_sync.lora: merged``: reload the model with each adapted weight set to
        ``W0 + scale * B @ A`` (``named``: the adapters; None: the ones staged by the last
        receive). W0 comes from the checkpoint the model was loaded from, read once and
        kept (one copy of the base in this worker)."""
        from hybridflow.lora.names import merged, pairs

        if named is None:
            named, self._hf_staged = getattr(self, "_hf_staged", None), None
            if named is None:
                raise ValueError("no staged adapter to merge")
        base = self._hf_base_weights()
        adapters = pairs(named)
        tensors = []
        for name, weight in base.items():
            layer = name.removesuffix(".weight")
            if name.endswith(".weight") and layer in adapters:
                a, b = adapters[layer]
                weight = merged(weight, a, b, scale)
            tensors.append((name, weight))
        self._reload(self._with_tied_head(tensors), sharded=False)

    def _hf_base_weights(self) -> dict[str, torch.Tensor]:
        base = getattr(self, "_hf_base", None)
        if base is None:
            from safetensors.torch import load_file

            dtype = self.model_config.dtype
            base = {}
            for path in sorted(Path(self.model_config.model).glob("*.safetensors")):
                for name, tensor in load_file(str(path)).items():
                    base[name] = tensor.to(dtype)
            self._hf_base = base
        return base

    # ------------------------------------------------------------------ loading

    def _with_tied_head(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> list[tuple[str, torch.Tensor]]:
        """With tied embeddings vLLM's head (where the family's model has one) keeps its own
        packed copy on CPU: feed it the embedding too; where it has none, drop the HF name."""
        out = list(named_tensors)
        dims = self._hf_dims()
        head = self._hf_family().engine_tied_head(dims)
        if head is not None and all(n != head for n, _ in out):
            out += [(head, t) for n, t in out if n == "model.embed_tokens.weight"]
        elif head is None and dims.tie_embeddings:
            out = [(n, t) for n, t in out if n != "lm_head.weight"]
        return out

    def _in_full_size(
        self, staged: list[tuple[str, torch.Tensor]], receiver: DistReceiver
    ) -> list[tuple[str, torch.Tensor]]:
        """Vocabulary and expert slices into their place in uninitialised full-size tensors."""
        out = []
        for name, tensor in staged:
            full = receiver.in_full_size(name, tensor)
            out.append((name, tensor if full is None else full))
        return out

    def _reload(self, named_tensors: list[tuple[str, torch.Tensor]], sharded: bool) -> list[str]:
        """Reloads through vLLM's loaders; returns the model's parameters they did not load
        (vLLM itself only logs them: a name its loader does not know is skipped silently, and
        the replica would serve the old tensor under the new version)."""
        model = self.model_runner.get_model()
        with _presharded_linears(model, sharded), _loaded_names(model) as loaded:
            self.reload_weights(weights_iterator=iter(named_tensors))
        _prepack_cpu_experts(model)
        self._hf_reattach_routing()
        if loaded is None or not loaded.reported:
            return []  # a model whose load_weights reports nothing: nothing to compare
        return sorted(loaded.expected - loaded.names)


class _Loaded:
    """The parameter names a reload was to load and those vLLM's ``load_weights`` reported."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.expected = {n.replace(".base_layer.", ".") for n, _ in model.named_parameters()}
        self.names: set[str] = set()
        self.reported = False
        """Whether ``load_weights`` returned a set (some models return None)."""


@contextmanager
def _loaded_names(model: torch.nn.Module) -> Iterator[_Loaded | None]:
    """Records what ``model.load_weights`` returns while the block runs (vLLM's reload calls
    it once and keeps the set to log); None for a model without the method."""
    original = getattr(model, "load_weights", None)
    if original is None:
        yield None
        return
    loaded = _Loaded(model)

    def recording(weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        result = original(weights)
        if result is not None:
            loaded.reported = True
            loaded.names.update(result)
        return result

    model.load_weights = recording  # type: ignore[method-assign,assignment]
    try:
        yield loaded
    finally:
        del model.load_weights  # the class's method again


def _prepack_cpu_experts(model: torch.nn.Module) -> int:
    """Prepack every FusedMoE layer's reloaded experts for vLLM's CPU kernel; the count.

    vLLM 0.32 on CPU prepacks ``w13_weight`` / ``w2_weight`` into its grouped-GEMM layout
    (same shape, other order) once, when the model is loaded. An in-place reload then copies
    the new checkpoint-format experts into that prepacked storage as they are (the weight-update
    branch of ``UnquantizedFusedMoEMethod._setup_kernel`` skips the prepack), so the kernel
    would read them scrambled: measured, log-probs off by 0.4 after reloading the very
    weights the model was loaded with. Running the kernel's own prepack after each reload
    restores parity. Nothing happens on other kernels (CUDA's read the weights as loaded).
    """
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a build without the CPU kernels
        return 0
    count = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)
            count += 1
    return count


def engine_param_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> local shape of every checkpoint-format parameter of a loaded vLLM model.

    On CPU vLLM repacks linear weights after loading and leaves those parameters empty; the
    shapes its loaders fill are in the metadata it recorded for in-place reloads (which
    leaves out biases, kept as they are, and names a tied head under its own module too).
    The live parameters fill in whatever that metadata does not name.
    """
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for module_name, layer in model.named_modules():
        info = LAYERWISE_INFO.get(layer)
        if info is None:
            continue
        for name, meta in info.restore_metadata[0].items():
            shapes[f"{module_name}.{name}" if module_name else name] = tuple(meta.shape)
    # With LoRA enabled vLLM wraps each adaptable layer; its weights sit under ``base_layer``.
    return {name.replace(".base_layer.", "."): shape for name, shape in shapes.items()}


@contextmanager
def _presharded_linears(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Make every linear layer's loader take this rank's slices as they are, for one reload.

    vLLM's linear loaders cut rank ``tp_rank``'s part out of a whole tensor. Its newer
    parameters (``BasevLLMParameter``) read ``tp_rank`` from the parameter: set to 0, the cut
    of a tensor that already is this rank's slice is the whole slice. Plain parameters honour
    ``is_sharded_weight`` instead. The reload rebuilds parameters from metadata recorded when
    the model was loaded, so the marks go on that metadata as well as on the live
    parameters; all are restored afterwards.
    """
    if not enabled:
        yield
        return
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    tensors: list[Any] = []
    for layer in model.modules():
        if not isinstance(layer, LinearBase):
            continue
        tensors += list(layer.parameters(recurse=False))
        info = LAYERWISE_INFO.get(layer)
        if info is not None:
            tensors += list(info.restore_metadata[0].values())
    saved: list[tuple[Any, int | None]] = []
    for tensor in tensors:
        saved.append((tensor, tensor.__dict__.get("tp_rank")))
        if "tp_rank" in tensor.__dict__:
            tensor.tp_rank = 0
        else:
            tensor.is_sharded_weight = True
    try:
        yield
    finally:
        for tensor, tp_rank in saved:
            if tp_rank is not None:
                tensor.tp_rank = tp_rank
            tensor.__dict__.pop("is_sharded_weight", None)
