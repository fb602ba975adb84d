"""What the Tinker-compatible service does, transport-free: sessions, models (one LoRA tenant
each), the calls that do work as futures (``operations.Operations``), and what each one runs on
the tenant engine (``learner.tenants.TenantTrainer``). ``app.py`` puts HTTP in front of it.

Owners: every call comes with the owner its API key names (``app.py``); a session, a model and
a future belong to the owner that made them, and another owner's are unknown to it (never
"forbidden": their existence is not told). Model ids are ``<session>:train:<n>``, the id the
SDK itself assumes (docs/tinker-wire.md §2.2).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from hybridflow.errors import BadRequest
from hybridflow.services.learner.tenants import (
    LORA_ALPHA,
    AdamParams,
    AdapterSpec,
    TenantTrainer,
)
from hybridflow.services.tinker.convert import (
    ForwardBackwardCall,
    decode_forward_backward,
    encode_forward_backward,
)
from hybridflow.services.tinker.operations import Operation, Operations, Result, UserError

NOT_SERVED_YET = (
    "save_weights",
    "save_weights_for_sampler",
    "load_weights",
)
"""Calls the SDK makes that this service refuses, each as a failed future (so the model's
``seq_id`` order goes on): see docs/tinker.md, "What is not served"."""


class NotFound(KeyError):
    """No such session, model or future for this owner."""


@dataclass
class ServedBase:
    """The one base model: the names the SDK may ask for it by, and what ``get_info`` tells."""

    name: str
    """The name ``get_info`` reports as the model name (``model_data.model_name``)."""
    tokenizer_id: str
    """A local tokenizer directory, so nothing is downloaded."""
    aliases: tuple[str, ...] = ()
    """Other names a ``create_model`` may ask for (a hub id mapped to the local checkpoint)."""

    def accepts(self, base_model: str) -> bool:
        return base_model in (self.name, self.tokenizer_id, *self.aliases)


@dataclass
class _Model:
    owner: str
    session_id: str
    spec: AdapterSpec
    user_metadata: dict[str, Any] = field(default_factory=dict)
    created: bool = False


class TinkerService:
    """The service's state and calls. ``trainer`` holds every tenant's adapter on the base."""

    def __init__(
        self,
        trainer: TenantTrainer,
        base: ServedBase,
        max_sessions: int = 256,
        max_queued_per_model: int = 64,
    ) -> None:
        self.trainer = trainer
        self.base = base
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: dict[str, str] = {}
        self._models: dict[str, _Model] = {}
        self.operations = Operations(self._run, max_queued_per_model=max_queued_per_model)

    def close(self) -> None:
        self.operations.close()

    @staticmethod
    def client_config() -> dict[str, Any]:
        """Plain httpx (no pyqwest), one fwd/bwd chunk in flight at a time, no zstd bodies."""
        return {
            "use_pyqwest_transport": False,
            "parallel_fwdbwd_chunks": False,
            "proto_compress_fwdbwd": False,
            "pjwt_auth_enabled": False,
            "custom_loss_server_side": False,
        }

    def create_session(self, owner: str) -> str:
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise UserError(f"at most {self.max_sessions} sessions on this service")
            session_id = uuid.uuid4().hex[:16]
            self._sessions[session_id] = owner
            return session_id

    def heartbeat(self, owner: str, session_id: str) -> None:
        self._session(owner, session_id)

    def create_model(self, owner: str, body: dict[str, Any], idempotency_key: str | None) -> str:
        session_id = str(body.get("session_id", ""))
        self._session(owner, session_id)
        base_model = str(body.get("base_model", ""))
        if not self.base.accepts(base_model):
            raise UserError(
                f"base_model {base_model!r} is not served here; this service serves "
                f"{self.base.name!r} (also as {list(self.base.aliases)})"
            )
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UserError(f"optimizer {optimizer!r} is not served; adamw is")
        lora = body.get("lora_config") or {}
        spec = AdapterSpec(
            rank=_int(lora.get("rank", 32), "lora_config.rank"),
            seed=_int(lora.get("seed") or 0, "lora_config.seed"),
            train_attn=bool(lora.get("train_attn", True)),
            train_mlp=bool(lora.get("train_mlp", True)),
            train_unembed=bool(lora.get("train_unembed", True)),
        )
        model_id = f"{session_id}:train:{_int(body.get('model_seq_id', 0), 'model_seq_id')}"
        with self._lock:
            existing = self._models.get(model_id)
            if existing is None:
                self._models[model_id] = _Model(
                    owner, session_id, spec, dict(body.get("user_metadata") or {})
                )
        self.operations.open_model(model_id)
        return self.operations.submit(
            owner, "create_model", model_id, idempotency_key=idempotency_key or f"create:{model_id}"
        )

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        model = self._model(owner, model_id)
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {
                "arch": "lora",
                "model_name": self.base.name,
                "tokenizer_id": self.base.tokenizer_id,
            },
            "optimizer_config": {"type": "adamw"},
            "is_lora": True,
            "lora_rank": model.spec.rank,
            "model_name": self.base.name,
            "lora_alpha": LORA_ALPHA,
        }

    def forward_backward(self, owner: str, body: bytes, idempotency_key: str | None) -> str:
        call = decode_forward_backward(body)
        self._model(owner, call.model_id)
        return self.operations.submit(
            owner, "forward_backward", call, call.model_id, call.seq_id, idempotency_key
        )

    def optim_step(self, owner: str, body: dict[str, Any], idempotency_key: str | None) -> str:
        model_id = str(body.get("model_id", ""))
        self._model(owner, model_id)
        if body.get("optimizer_params") is not None:
            raise UserError("optimizer_params (non-Adam optimizers) are not served; adam_params is")
        raw = body.get("adam_params") or {}
        adam = AdamParams(
            **{k: float(v) for k, v in raw.items() if k in AdamParams.__dataclass_fields__}
        )
        return self.operations.submit(
            owner, "optim_step", adam, model_id, _seq(body), idempotency_key
        )

    def not_served(
        self, owner: str, kind: str, body: dict[str, Any], idempotency_key: str | None
    ) -> str:
        """A call with a ``seq_id`` that this service does not serve yet: queued in its place
        (so the model's later calls still run) and failed there, naming the call."""
        model_id = str(body.get("model_id", ""))
        self._model(owner, model_id)
        return self.operations.submit(owner, kind, None, model_id, _seq(body), idempotency_key)

    def retrieve(self, owner: str, request_id: str, timeout: float) -> Result | None:
        try:
            return self.operations.wait(owner, request_id, timeout)
        except KeyError:
            raise NotFound(f"no future {request_id!r}") from None

    def _run(self, op: Operation) -> Result:
        if op.kind == "create_model":
            model_id = op.payload
            model = self._models[model_id]
            if not model.created:
                self.trainer.create(model_id, model.spec)
                model.created = True
            return Result(json={"type": "create_model", "model_id": model_id})
        if op.kind == "forward_backward":
            call: ForwardBackwardCall = op.payload
            logprobs, metrics = self.trainer.forward_backward(
                call.model_id, call.datums, call.loss_fn, call.config, call.forward_only
            )
            return Result(proto=encode_forward_backward(logprobs, metrics))
        if op.kind == "optim_step":
            assert op.model_id is not None
            metrics = self.trainer.optim_step(op.model_id, op.payload)
            return Result(json={"type": "optim_step", "metrics": metrics})
        raise UserError(f"{op.kind} is not served by this service yet (docs/tinker.md)")

    def _session(self, owner: str, session_id: str) -> None:
        with self._lock:
            if self._sessions.get(session_id) != owner:
                raise NotFound(f"no session {session_id!r}")

    def _model(self, owner: str, model_id: str) -> _Model:
        with self._lock:
            model = self._models.get(model_id)
        if model is None or model.owner != owner:
            raise NotFound(f"no model {model_id!r}")
        return model


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{what} must be an integer, got {value!r}")
    return value


def _seq(body: dict[str, Any]) -> int:
    return _int(body.get("seq_id"), "seq_id")
