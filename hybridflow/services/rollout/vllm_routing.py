"""Recording the experts a mixture-of-experts model in vLLM routes each token to, per request.

The learner's router replay (``learner.moe_router_replay``) needs, for every completion, the
experts the rollout engine chose for each token it read. vLLM 0.32 has its own capture
(``enable_return_routed_experts``), but only in Model Runner V2, which needs Triton and so is
missing from the CPU build. This records the same ids from the same place: every FusedMoE
layer's router reports the logical expert ids it selected (``set_capture_fn``, before any
expert-parallel remapping), and a hook after the model's forward cuts that step's rows by
request and position with the model runner's own batch layout (``query_start_loc``,
``num_computed_tokens``). Positions are kept, so chunked prefill and a recomputed
(preempted) request come out right.

Not covered: kernels that route inside a monolithic CUDA kernel (vLLM feeds those through a
``RoutedExpertsSink``); there the CUDA build's own capture is the way.

Runs inside vLLM's worker processes; knows vLLM's model runner, nothing of gRPC.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch


def moe_routers(model: torch.nn.Module) -> list[Any]:
    """The router of every FusedMoE layer of a vLLM model, in layer order."""
    out = []
    for _, module in model.named_modules():
        router = getattr(module, "router", None)
        if router is not None and hasattr(router, "set_capture_fn"):
            out.append(router)
    return out


class RoutingRecorder:
    """Per request (vLLM's internal id), the routing of every position its steps computed."""

    def __init__(self, model_runner: Any) -> None:
        self._runner = model_runner
        self._step: dict[int, torch.Tensor] = {}
        self._chunks: dict[str, list[tuple[int, np.ndarray]]] = {}
        self._hook: Any = None
        self.num_layers = 0
        self.top_k = 0

    def attach(self) -> int:
        """Hook every router and the model's forward (again after a reload); the layer count."""
        model = self._runner.get_model()
        routers = moe_routers(model)
        for layer, router in enumerate(routers):
            router.set_capture_fn(partial(self._capture, layer))
        if self._hook is None:
            self._hook = model.register_forward_hook(self._after_forward)
        self.num_layers = len(routers)
        self.top_k = int(routers[0].top_k) if routers else 0
        return self.num_layers

    def detach(self) -> None:
        for router in moe_routers(self._runner.get_model()):
            router.set_capture_fn(None)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._chunks.clear()

    def _capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        self._step[layer] = topk_ids.detach().clone()

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        step, self._step = self._step, {}
        batch = self._runner.input_batch
        num_reqs = int(batch.num_reqs)
        if num_reqs == 0 or len(step) != self.num_layers:
            return  # a dummy or profiling run
        bounds = self._runner.query_start_loc.np[: num_reqs + 1]
        num_tokens = int(bounds[-1])
        if any(t.shape[0] < num_tokens for t in step.values()):
            return
        # [tokens, layers, top_k], one copy off the device for the whole step
        rows = torch.stack([step[i][:num_tokens] for i in range(self.num_layers)], dim=1)
        routing = rows.to("cpu").numpy().astype(np.int16)
        starts = batch.num_computed_tokens_cpu[:num_reqs]
        for k, req_id in enumerate(batch.req_ids[:num_reqs]):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            if hi > lo:
                self._chunks.setdefault(req_id, []).append((int(starts[k]), routing[lo:hi]))

    def take(self, request_ids: list[str]) -> dict[str, np.ndarray]:
        """The routing of each named request (the engine's id; vLLM appends a suffix to it
        internally), ``[positions, layers, top_k]`` int16, ``-1`` where a position was never
        computed; forgets them. Requests without any recorded step are left out."""
        wanted = set(request_ids)
        out: dict[str, np.ndarray] = {}
        for internal in [r for r in self._chunks if r.split("-", 1)[0] in wanted]:
            chunks = self._chunks.pop(internal)
            length = max(start + len(part) for start, part in chunks)
            full = np.full((length, self.num_layers, self.top_k), -1, dtype=np.int16)
            for start, part in chunks:  # in step order: a recomputed position is overwritten
                full[start : start + len(part)] = part
            out[internal.split("-", 1)[0]] = full
        return out


class RoutingCaptureWorker:
    """vLLM worker mixin (see ``vllm_worker``): routing capture on request."""

    model_runner: Any

    def hf_moe_layers(self) -> int:
        """How many mixture-of-experts layers the loaded model has (0: a dense model)."""
        return len(moe_routers(self.model_runner.get_model()))

    def hf_capture_routing(self, enabled: bool) -> int:
        """Start (or stop) recording every request's routing; the number of MoE layers."""
        recorder: RoutingRecorder | None = getattr(self, "_hf_routing", None)
        if not enabled:
            if recorder is not None:
                recorder.detach()
            self._hf_routing = None
            return 0
        if recorder is None:
            recorder = RoutingRecorder(self.model_runner)
            self._hf_routing = recorder
        return recorder.attach()

    def hf_take_routing(self, request_ids: list[str]) -> dict[str, np.ndarray]:
        """The recorded routing of these requests (see ``RoutingRecorder.take``)."""
        recorder: RoutingRecorder | None = getattr(self, "_hf_routing", None)
        return {} if recorder is None else recorder.take(request_ids)

    def _hf_reattach_routing(self) -> None:
        """After a reload: hook the routers again, in case vLLM rebuilt them."""
        recorder: RoutingRecorder | None = getattr(self, "_hf_routing", None)
        if recorder is not None:
            recorder.attach()
