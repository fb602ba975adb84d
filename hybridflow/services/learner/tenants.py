"""Many LoRA tenants on one base model: what the learner does for the Tinker-compatible
service (``hybridflow/services/tinker/``, docs/tinker-wire.md).

Each tenant is a peft adapter of its own name on the one base, with its own AdamW state and
step count. A call names its tenant; the tenant's adapter is made the active one for that
call only, so a ``forward_backward`` accumulates gradients in that adapter alone and an
``optim_step`` steps that tenant's optimizer alone: two tenants' calls may interleave in any
order and each tenant's curve is its solo curve. The base stays frozen. Calls run one at a
time (the caller serialises them: one device).

One file because the tenants and the frozen sampling adapters act on the same peft layers of
one model (which adapter is active, which parameters train); split, each part would reach
into the other's state.

Losses are Tinker's (``tenant_losses``): sums over tokens, not means. Position ``i`` of a datum's tokens predicts
``target_tokens[i]``. Transport-free and one rank: knows nothing of HTTP or gRPC.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from hybridflow.errors import BadRequest
from hybridflow.services.learner.tenant_losses import INPUTS as LOSS_INPUTS
from hybridflow.services.learner.tenant_losses import LOSSES, loss, resolve_config

if TYPE_CHECKING:
    import torch
    from torch import nn

LORA_ALPHA = 32.0
"""The adapters' scale numerator (``alpha / rank``), for every tenant: the SDK's
``lora_config`` has no alpha."""

ATTN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
UNEMBED_TARGETS = ("lm_head",)


@dataclass(frozen=True)
class AdapterSpec:
    """A tenant's adapter, as the SDK's ``lora_config`` asks for it."""

    rank: int
    seed: int = 0
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def targets(self) -> list[str]:
        return [
            *(ATTN_TARGETS if self.train_attn else ()),
            *(MLP_TARGETS if self.train_mlp else ()),
            *(UNEMBED_TARGETS if self.train_unembed else ()),
        ]


@dataclass(frozen=True)
class Datum:
    """One sequence: ``tokens`` (int) in, per-token ``inputs`` of the loss (each of
    ``len(tokens)``)."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class AdamParams:
    """One ``optim_step``'s AdamW settings; ``grad_clip_norm`` 0 clips nothing."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class _Tenant:
    spec: AdapterSpec
    params: list[Any]
    optimizer: Any
    steps: int = 0
    pending_datums: int = 0
    """Datums whose gradients wait for the next ``optim_step``."""


class TenantError(BadRequest):
    """A call the tenant engine refuses: unknown tenant, bad datum, unknown loss, a bound
    reached. Nothing changed."""


class TenantTrainer:
    """LoRA tenants on ``model`` (a causal LM, frozen here), at most ``max_tenants``."""

    def __init__(
        self,
        model: nn.Module,
        max_tenants: int = 8,
        max_tokens: int = 65536,
        max_frozen: int = 8,
    ) -> None:
        """``max_frozen``: how many frozen adapters (sampling snapshots, ``add_frozen``) the
        model holds besides the tenants."""
        if max_tenants < 1 or max_frozen < 1:
            raise ValueError(f"max_tenants and max_frozen must be at least 1, got {max_tenants}")
        for param in model.parameters():
            param.requires_grad_(False)
        self.model = model
        self.max_tenants = max_tenants
        self.max_tokens = max_tokens
        self._tenants: dict[str, _Tenant] = {}
        self.max_frozen = max_frozen
        self._frozen: dict[str, AdapterSpec] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self._tenants)

    def steps(self, name: str) -> int:
        return self._tenant(name).steps

    def create(self, name: str, spec: AdapterSpec) -> None:
        """Add tenant ``name``: a fresh adapter (B zero, so it starts as the base; A from
        ``spec.seed``) and a fresh AdamW."""
        import torch

        if name in self._tenants or name in self._frozen:
            raise TenantError(f"tenant {name!r} exists")
        if len(self._tenants) >= self.max_tenants:
            raise TenantError(
                f"at most {self.max_tenants} tenants on this learner; "
                f"{len(self._tenants)} exist ({', '.join(self.names)})"
            )
        if not 1 <= spec.rank <= 1024:
            raise TenantError(f"lora rank must be in [1, 1024], got {spec.rank}")
        if not spec.targets():
            raise TenantError("lora_config trains nothing: train_attn, train_mlp and train_unembed")
        self._inject(name, spec)
        params = self._adapter_params(name)
        for param in self.model.parameters():
            param.requires_grad_(False)
        optimizer = torch.optim.AdamW(params, lr=0.0)
        self._tenants[name] = _Tenant(spec=spec, params=params, optimizer=optimizer)

    def drop(self, name: str) -> None:
        self._tenant(name)
        self._delete_adapter(name)
        del self._tenants[name]

    @property
    def frozen(self) -> list[str]:
        return list(self._frozen)

    def add_frozen(self, name: str, state: dict[str, Any]) -> None:
        """A frozen adapter ``name`` from a ``state`` (a tenant's, at some step): what a
        sampling session samples with. At most ``max_frozen``; nothing trains it."""
        if name in self._frozen or name in self._tenants:
            raise TenantError(f"adapter {name!r} exists")
        if len(self._frozen) >= self.max_frozen:
            raise TenantError(f"at most {self.max_frozen} frozen adapters on this model")
        spec = AdapterSpec(**state["spec"])
        self._inject(name, spec)
        live = {
            _placeholder(n, name): p for n, p in self.model.named_parameters() if _mine(n, name)
        }
        if set(live) != set(state["adapter"]):
            self._delete_adapter(name)
            raise TenantError(f"the saved adapter does not fit its own spec (rank {spec.rank})")
        import torch

        with torch.no_grad():
            for key, tensor in state["adapter"].items():
                live[key].copy_(tensor)
        for param in self.model.parameters():
            param.requires_grad_(False)
        self._frozen[name] = spec

    def remove_frozen(self, name: str) -> None:
        if name not in self._frozen:
            raise TenantError(f"no frozen adapter {name!r}")
        self._delete_adapter(name)
        del self._frozen[name]

    def using(self, name: str | None) -> Any:
        """A context in which the model runs with adapter ``name`` alone (a tenant's or a
        frozen one), or with none (the base) for None."""
        if name is None:
            from hybridflow.lora.peft_layers import adapters_off

            return adapters_off(self.model)
        if name not in self._tenants and name not in self._frozen:
            raise TenantError(f"no adapter {name!r} on this model")
        return _ActiveAdapter(self.model, name)

    def using_by_row(self, names: list[str | None]) -> Any:
        """A context in which row ``i`` of a batch runs with adapter ``names[i]`` (a tenant's
        or a frozen one; None: the base), several in one batch (inference only)."""
        from hybridflow.lora.peft_layers import BASE_ROW, adapters_by_row

        for name in set(names) - {None}:
            if name not in self._tenants and name not in self._frozen:
                raise TenantError(f"no adapter {name!r} on this model")
        return adapters_by_row(self.model, [BASE_ROW if n is None else n for n in names])

    def _delete_adapter(self, name: str) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        with warnings.catch_warnings():  # "the active adapter was deleted": set per call
            warnings.simplefilter("ignore", UserWarning)
            for module in self.model.modules():
                if isinstance(module, BaseTunerLayer) and name in getattr(module, "lora_A", {}):
                    cast(Any, module).delete_adapter(name)

    def forward_backward(
        self,
        name: str,
        datums: list[Datum],
        loss_fn: str,
        config: dict[str, float] | None = None,
        forward_only: bool = False,
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """Per-datum log-probs of the target tokens (float32 ``[len]``) and the metrics
        (``loss:sum``); unless ``forward_only``, the loss's gradients are added to tenant
        ``name``'s adapter."""
        import torch

        tenant = self._tenant(name)
        self._check(datums, loss_fn)
        resolved = resolve_config(loss_fn, config or {})
        batch = _pad(datums)
        with self._active(name), torch.set_grad_enabled(not forward_only):
            logits = self.model(
                input_ids=batch["tokens"], attention_mask=batch["mask"].long()
            ).logits.float()
            logprobs = torch.log_softmax(logits, dim=-1)
            target_lp = logprobs.gather(-1, batch["target_tokens"].unsqueeze(-1)).squeeze(-1)
            total = loss(loss_fn, target_lp, batch, resolved)
            if not forward_only:
                total.backward()
                tenant.pending_datums += len(datums)
        out = target_lp.detach()
        lengths = [len(d.tokens) for d in datums]
        per_datum = [out[i, :n].numpy().astype(np.float32) for i, n in enumerate(lengths)]
        return per_datum, {"loss:sum": float(total.detach())}

    def optim_step(self, name: str, adam: AdamParams) -> dict[str, float]:
        """One AdamW step of tenant ``name`` on the gradients its ``forward_backward`` calls
        added since its last step; the gradients are then cleared."""
        import torch

        tenant = self._tenant(name)
        for value, what in (
            (adam.learning_rate, "learning_rate"),
            (adam.eps, "eps"),
            (adam.weight_decay, "weight_decay"),
            (adam.grad_clip_norm, "grad_clip_norm"),
        ):
            if not math.isfinite(value) or value < 0:
                raise TenantError(f"adam_params.{what} must be finite and >= 0, got {value}")
        for value, what in ((adam.beta1, "beta1"), (adam.beta2, "beta2")):
            if not 0 <= value < 1:
                raise TenantError(f"adam_params.{what} must be in [0, 1), got {value}")
        grads = [p.grad for p in tenant.params if p.grad is not None]
        norm = (
            float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
            if grads
            else 0.0
        )
        if adam.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(tenant.params, adam.grad_clip_norm)
        for group in tenant.optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        tenant.optimizer.step()
        tenant.optimizer.zero_grad(set_to_none=True)
        tenant.steps += 1
        tenant.pending_datums = 0
        return {"grad_norm:mean": norm, "step:max": float(tenant.steps)}

    def state(self, name: str, optimizer: bool = True) -> dict[str, Any]:
        """Tenant ``name``'s adapter tensors (by parameter name, the tenant's own name
        replaced by ``{tenant}``), spec and step count, and unless ``optimizer`` is False its
        AdamW state: what ``load`` takes back, under any tenant name. Tensors and plain values
        only (``torch.load(weights_only=True)`` reads it)."""
        tenant = self._tenant(name)
        out: dict[str, Any] = {
            "adapter": {
                _placeholder(n, name): p.detach().clone()
                for n, p in self.model.named_parameters()
                if _mine(n, name)
            },
            "spec": asdict(tenant.spec),
            "steps": tenant.steps,
        }
        if optimizer:
            out["optimizer"] = tenant.optimizer.state_dict()
        return out

    def load(self, name: str, state: dict[str, Any], optimizer: bool = True) -> None:
        """Tenant ``name``'s adapter (and, with ``optimizer``, its AdamW state and step count)
        from a ``state``; all or nothing: every tensor's name and shape is checked first.
        Gradients waiting for a step are dropped."""
        import torch

        tenant = self._tenant(name)
        live = {
            _placeholder(n, name): p for n, p in self.model.named_parameters() if _mine(n, name)
        }
        given = state.get("adapter", {})
        if set(given) != set(live):
            missing = sorted(set(live) - set(given))[:3]
            extra = sorted(set(given) - set(live))[:3]
            raise TenantError(
                f"the saved adapter does not fit tenant {name!r} (rank {tenant.spec.rank}): "
                f"missing {missing}, unknown {extra}"
            )
        for key, tensor in given.items():
            if tuple(tensor.shape) != tuple(live[key].shape):
                raise TenantError(
                    f"saved adapter tensor {key!r} has shape {tuple(tensor.shape)}, "
                    f"tenant {name!r}'s is {tuple(live[key].shape)}"
                )
        if optimizer and "optimizer" not in state:
            raise TenantError("the saved state has no optimizer state (a sampler checkpoint)")
        with torch.no_grad():
            for key, tensor in given.items():
                live[key].copy_(tensor)
        tenant.optimizer.zero_grad(set_to_none=True)
        tenant.pending_datums = 0
        if optimizer:
            tenant.optimizer.load_state_dict(state["optimizer"])
            tenant.steps = int(state["steps"])

    def _inject(self, name: str, spec: AdapterSpec) -> None:
        import torch
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model

        config = PeftLoraConfig(
            r=spec.rank, lora_alpha=int(LORA_ALPHA), target_modules=spec.targets(), bias="none"
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            try:
                with warnings.catch_warnings():
                    # "several adapters in one model" and "a tied head has an adapter": both
                    # meant here (each tenant its own adapter; the tied base stays frozen)
                    warnings.simplefilter("ignore", UserWarning)
                    inject_adapter_in_model(config, self.model, adapter_name=name)
            except ValueError as exc:
                raise TenantError(f"lora_config: {exc}") from exc

    def _tenant(self, name: str) -> _Tenant:
        try:
            return self._tenants[name]
        except KeyError:
            raise TenantError(f"no tenant {name!r} on this learner") from None

    def _adapter_params(self, name: str) -> list[Any]:
        return [p for n, p in self.model.named_parameters() if _mine(n, name)]

    def _check(self, datums: list[Datum], loss_fn: str) -> None:
        if loss_fn not in LOSS_INPUTS:
            raise TenantError(f"loss_fn {loss_fn!r} is not served; the built-in ones: {LOSSES}")
        if not datums:
            raise TenantError("forward_backward with no datums")
        total = sum(len(d.tokens) for d in datums)
        if total > self.max_tokens:
            raise TenantError(f"{total} tokens in one call; the bound is {self.max_tokens}")
        vocab = cast(Any, self.model).get_output_embeddings().weight.shape[0]
        for i, datum in enumerate(datums):
            n = len(datum.tokens)
            if n == 0:
                raise TenantError(f"datum {i} has no tokens")
            for key in LOSS_INPUTS[loss_fn]:
                if key == "weights" and key not in datum.inputs:
                    continue
                if key not in datum.inputs:
                    raise TenantError(f"datum {i}: {loss_fn} needs loss_fn_inputs[{key!r}]")
                if datum.inputs[key].shape != (n,):
                    raise TenantError(
                        f"datum {i}: loss_fn_inputs[{key!r}] has shape "
                        f"{datum.inputs[key].shape}, the tokens' is ({n},)"
                    )
            for key, ids in (
                ("model_input", datum.tokens),
                ("target_tokens", datum.inputs["target_tokens"]),
            ):
                if ids.min() < 0 or ids.max() >= vocab:
                    raise TenantError(f"datum {i}: {key} holds ids outside [0, {vocab})")

    def _active(self, name: str) -> Any:
        return _ActiveAdapter(self.model, name)


class _ActiveAdapter:
    """``name`` is the active adapter of every tuner layer inside the block (peft makes only
    the active adapter's parameters trainable); the base stays frozen."""

    def __init__(self, model: nn.Module, name: str) -> None:
        self.model = model
        self.name = name

    def __enter__(self) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.set_adapter(self.name)

    def __exit__(self, *exc: object) -> None:
        return None


def _placeholder(param_name: str, tenant: str) -> str:
    return param_name.replace(f".{tenant}.", ".{tenant}.")


def _mine(param_name: str, tenant: str) -> bool:
    return f".lora_A.{tenant}." in param_name or f".lora_B.{tenant}." in param_name


def _pad(datums: list[Datum]) -> dict[str, torch.Tensor]:
    """Right-padded batch: tokens, attention mask and each per-token input."""
    import torch

    width = max(len(d.tokens) for d in datums)
    rows = len(datums)
    tokens = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    keys = sorted(set().union(*(d.inputs for d in datums)))
    inputs = {
        k: torch.zeros(rows, width, dtype=torch.long if k == "target_tokens" else torch.float32)
        for k in keys
    }
    for i, datum in enumerate(datums):
        n = len(datum.tokens)
        tokens[i, :n] = torch.from_numpy(datum.tokens.astype(np.int64))
        mask[i, :n] = True
        for k in keys:
            if k in datum.inputs:
                inputs[k][i, :n] = torch.from_numpy(np.array(datum.inputs[k]))
            elif k == "weights":
                inputs[k][i, :n] = 1.0
    if "weights" not in inputs:
        inputs["weights"] = mask.float()
    return {"tokens": tokens, "mask": mask, **inputs}
