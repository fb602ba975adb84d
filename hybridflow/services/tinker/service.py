"""What the Tinker-compatible service does, transport-free: sessions, models (one LoRA tenant
each), and the calls that do work, accepted as futures (``operations.Operations``), journaled
(``store.Store``) and run by ``work.Work`` on the tenant engine. ``app.py`` puts HTTP in front.

Owners: every call comes with the owner its API key names (``app.py``); a session, a model, a
checkpoint and a future belong to the owner that made them, and another owner's are unknown
to it (never "forbidden": their existence is not told). Model ids are
``<session>:train:<n>``, the id the SDK itself assumes (docs/tinker-wire.md §2.2).

One class because every call checks and changes the same tables (sessions, models, owners)
under one lock, and its journal hooks record those changes as they happen; the work itself
(``work.py``), the queue (``operations.py``), the disk (``store.py``) and restart
(``recovery.py``) live apart. Its next split, along the journal hooks, comes with moving the
tenants behind the learner service.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from hybridflow.errors import BadRequest
from hybridflow.services.learner.tenants import LORA_ALPHA, AdamParams, AdapterSpec, TenantTrainer
from hybridflow.services.tinker.convert import decode_forward_backward, prompt_tokens
from hybridflow.services.tinker.operations import Operation, Operations, Result, UserError
from hybridflow.services.tinker.sampler import MAX_SAMPLES, SampleParams
from hybridflow.services.tinker.store import Store, encode_bytes
from hybridflow.services.tinker.work import (
    Model,
    NotFound,
    SamplerSession,
    ServedBase,
    Tokens,
    Work,
    parse_path,
)

__all__ = ["NotFound", "ServedBase", "TinkerService", "Tokens"]

log = logging.getLogger("hybridflow.tinker")


class TinkerService:
    """The service's state and calls. ``trainer`` holds every tenant's adapter on the base;
    with a ``store`` every acknowledged call survives a restart (``store.py``)."""

    def __init__(
        self,
        trainer: TenantTrainer,
        base: ServedBase,
        store: Store | None = None,
        max_sessions: int = 256,
        max_queued_per_model: int = 64,
        tokens: Tokens | None = None,
        session_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        compact_journal_bytes: int = 256 << 20,
        max_sample_batch: int = 64,
    ) -> None:
        """A session with no call and no heartbeat for ``session_timeout_s`` (on ``clock``)
        is finished as if its client had closed it (the SDK heartbeats every 10 s while it
        lives): a client that dies never holds tenant places for good."""
        self.base = base
        self.store = store
        self.max_sessions = max_sessions
        self.session_timeout_s = session_timeout_s
        self.compact_journal_bytes = compact_journal_bytes
        """The journal is compacted when a result's record takes it this far past what the
        last compaction left (what that keeps, the results still answered, may alone pass the
        bound: no compaction after every call then)."""
        self._compact_at = compact_journal_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, str] = {}
        self._seen: dict[str, float] = {}
        self._models: dict[str, Model] = {}
        self._owners: dict[str, str] = {}
        """Every model ever made, by id: its owner (a finished model's checkpoints stay its
        owner's)."""
        self.work = Work(trainer, store, self._models, tokens)
        self.operations = Operations(
            self.work.run,
            max_queued_per_model=max_queued_per_model,
            on_submit=self._journal_submit if store else None,
            on_done=self._journal_done if store else None,
            start=False,
            run_batch=self.work.run_batch,
            batch_kinds=frozenset({"sample"}),
            max_batch=max_sample_batch,
        )
        if store is not None:
            from hybridflow.services.tinker.recovery import recover

            recover(store, self.work, self.operations, self._sessions, self._owners)
        now = clock()
        self._seen = dict.fromkeys(self._sessions, now)  # a restart gives clients time back
        self.operations.start()

    def close(self) -> None:
        self.operations.close()
        if self.store is not None:
            self.store.close()

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
        self.expire_idle()
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise UserError(f"at most {self.max_sessions} sessions on this service")
            session_id = uuid.uuid4().hex[:16]
            if self.store is not None:
                self.store.append({"t": "session", "id": session_id, "owner": owner})
            self._sessions[session_id] = owner
            self._seen[session_id] = self._clock()
            return session_id

    def heartbeat(self, owner: str, session_id: str) -> None:
        self._session(owner, session_id)

    def expire_idle(self) -> list[str]:
        """Finishes the sessions idle past ``session_timeout_s``; their ids."""
        now = self._clock()
        with self._lock:
            idle = [
                (sid, self._sessions[sid])
                for sid, seen in self._seen.items()
                if now - seen > self.session_timeout_s and sid in self._sessions
            ]
        for session_id, owner in idle:
            log.info(
                "session %s idle for over %.0f s: finished", session_id, self.session_timeout_s
            )
            self.finish_session(owner, session_id, reason="expired")
        return [sid for sid, _ in idle]

    def finish_session(self, owner: str, session_id: str, reason: str = "finished") -> None:
        """The session is over (the SDK's ``ServiceClient.close``, or idle too long): its
        models leave the learner, freeing their tenant places; their state files and
        checkpoints stay. Later calls on them answer "not found"."""
        self._session(owner, session_id)
        with self._lock:
            if self.store is not None:
                self.store.append({"t": "finish", "id": session_id, "reason": reason})
            del self._sessions[session_id]
            self._seen.pop(session_id, None)
            gone = [m for m, model in self._models.items() if model.session_id == session_id]
            for model_id in gone:
                del self._models[model_id]
        for model_id in gone:
            self.operations.submit(owner, "drop_model", model_id)

    def create_model(self, owner: str, body: dict[str, Any], idempotency_key: str | None) -> str:
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
        return self._new_model(owner, body, {"spec": asdict(spec)}, idempotency_key)

    def load_weights(self, owner: str, body: dict[str, Any], idempotency_key: str | None) -> str:
        """Both forms: into an existing model (``model_id`` and ``seq_id``) or a new model made
        from the checkpoint (``session_id`` and ``model_seq_id``, the SDK's create-via-load)."""
        base_model = body.get("base_model")
        if base_model is not None and not self.base.accepts(str(base_model)):
            raise UserError(f"base_model {base_model!r} is not served here ({self.base.name!r})")
        path = str(body.get("path", ""))
        source, _, _ = parse_path(path)
        self._own_checkpoints(owner, source)
        load = {"path": path, "optimizer": bool(body.get("optimizer", False))}
        if body.get("session_id") is None:
            model_id = str(body.get("model_id", ""))
            self._model(owner, model_id)
            return self.operations.submit(
                owner, "load_weights", load, model_id, _seq(body), idempotency_key
            )
        return self._new_model(owner, body, {"load": load}, idempotency_key)

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
            "lora_rank": model.spec.rank if model.spec else None,
            "model_name": self.base.name,
            "lora_alpha": LORA_ALPHA,
        }

    def forward_backward(self, owner: str, body: bytes, idempotency_key: str | None) -> str:
        call = decode_forward_backward(body)
        self._model(owner, call.model_id)
        return self.operations.submit(
            owner, "forward_backward", body, call.model_id, call.seq_id, idempotency_key
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
            owner, "optim_step", asdict(adam), model_id, _seq(body), idempotency_key
        )

    def save_weights(
        self, owner: str, kind: str, body: dict[str, Any], idempotency_key: str | None
    ) -> str:
        """``save_weights`` (the training state) or ``save_weights_for_sampler`` (the adapter),
        under a name; the unnamed sampler form needs sampling, not served yet."""
        model_id = str(body.get("model_id", ""))
        self._model(owner, model_id)
        payload = {"name": body.get("path"), "overwrite": bool(body.get("overwrite", False))}
        return self.operations.submit(owner, kind, payload, model_id, _seq(body), idempotency_key)

    def create_sampling_session(self, owner: str, body: dict[str, Any]) -> str:
        """A sampling session on a sampler checkpoint of one's own (``model_path``) or on the
        base (``base_model``)."""
        self._session(owner, str(body.get("session_id", "")))
        path = body.get("model_path")
        if path is not None:
            source, _, _ = parse_path(str(path))
            self._own_checkpoints(owner, source)
            self.work.check_checkpoint(str(path))
            return self.work.new_sampler(SamplerSession(owner, model_path=str(path)))
        base_model = str(body.get("base_model", ""))
        if not self.base.accepts(base_model):
            raise UserError(f"base_model {base_model!r} is not served here ({self.base.name!r})")
        return self.work.new_sampler(SamplerSession(owner))

    def get_sampler(self, owner: str, sampler_id: str) -> dict[str, Any]:
        session = self._sampler(owner, sampler_id)
        return {
            "sampler_id": sampler_id,
            "base_model": self.base.name,
            "model_path": session.model_path,
        }

    def sample(self, owner: str, body: dict[str, Any]) -> tuple[str, int]:
        """Queues one ``asample``; its request id and how many sequences it makes."""
        sampler_id = str(body.get("sampling_session_id", ""))
        self._sampler(owner, sampler_id)
        for unserved in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(unserved):
                raise UserError(f"{unserved} is not served (docs/tinker.md)")
        if body.get("target_prompt_logprobs") is not None:
            raise UserError("target_prompt_logprobs is not served (docs/tinker.md)")
        num = body.get("num_samples", 1)
        if not isinstance(num, int) or not 1 <= num <= MAX_SAMPLES:
            raise UserError(f"num_samples must be in [1, {MAX_SAMPLES}], got {num!r}")
        raw_params = body.get("sampling_params") or {}
        SampleParams.from_json(raw_params)  # refused here, not in the future
        payload = {
            "sampler": sampler_id,
            "prompt": prompt_tokens(body.get("prompt")).tolist(),
            "num_samples": num,
            "params": raw_params,
            "prompt_logprobs": bool(body.get("prompt_logprobs", False)),
        }
        request_id = self.operations.submit(owner, "sample", payload, f"sampler:{sampler_id}")
        return request_id, num

    def retrieve(self, owner: str, request_id: str, timeout: float) -> Result | None:
        try:
            return self.operations.wait(owner, request_id, timeout)
        except KeyError:
            raise NotFound(f"no future {request_id!r}") from None

    def _new_model(
        self, owner: str, body: dict[str, Any], how: dict[str, Any], idempotency_key: str | None
    ) -> str:
        self.expire_idle()
        session_id = str(body.get("session_id", ""))
        self._session(owner, session_id)
        model_id = f"{session_id}:train:{_int(body.get('model_seq_id', 0), 'model_seq_id')}"
        payload = {"model_id": model_id, "session_id": session_id, **how}
        payload["user_metadata"] = dict(body.get("user_metadata") or {})
        with self._lock:
            if model_id not in self._models:
                self._models[model_id] = Model.from_payload(owner, payload)
                self._owners[model_id] = owner
        self.operations.open_model(model_id)
        return self.operations.submit(
            owner, "create_model", payload, idempotency_key=idempotency_key or f"new:{model_id}"
        )

    def _journal_submit(self, op: Operation) -> None:
        assert self.store is not None
        if op.kind == "sample":
            return  # changes nothing: a sample lost in a restart is sent again by the SDK
        payload = op.payload
        if isinstance(payload, bytes):
            payload = {"body": encode_bytes(payload)}
        self.store.append(
            {
                "t": "submit",
                "rid": op.request_id,
                "owner": op.owner,
                "kind": op.kind,
                "model": op.model_id,
                "seq": op.seq_id,
                "idem": op.idempotency_key,
                "payload": payload,
            }
        )

    def _journal_done(self, op: Operation) -> None:
        assert self.store is not None and op.result is not None
        if op.kind == "sample":
            return
        result = op.result
        record: dict[str, Any] = {"t": "done", "rid": op.request_id}
        if result.error is not None:
            record.update(error=result.error, category=result.category)
        elif result.proto is not None:
            record["proto"] = encode_bytes(result.proto)
        else:
            record["json"] = result.json
        self.store.append(record)
        if self.store.journal_bytes() > self._compact_at:
            self._compact_journal()

    def _compact_journal(self) -> None:
        """Drops from the journal what a restart no longer reads (``recovery.needed``). Runs
        on the operations' worker, between two operations, with submits held off."""
        from hybridflow.services.tinker.recovery import needed

        assert self.store is not None
        store = self.store
        with self._lock:  # a create_model may add one meanwhile
            saved = {m: model.last_saved_seq for m, model in self._models.items()}
        before, after = self.operations.holding(
            lambda answered: store.rewrite(needed(answered, saved))
        )
        self._compact_at = after + self.compact_journal_bytes
        log.info("journal compacted: %d -> %d bytes", before, after)

    def _session(self, owner: str, session_id: str) -> None:
        """Checks the session is the owner's, and counts the call as its activity."""
        with self._lock:
            if self._sessions.get(session_id) != owner:
                raise NotFound(f"no session {session_id!r}")
            self._seen[session_id] = self._clock()

    def training_run(self, owner: str, model_id: str) -> dict[str, Any]:
        """The SDK's ``TrainingRun`` of a live model (the cookbook reads its
        ``user_metadata``, e.g. the renderer, when it resumes)."""
        model = self._model(owner, model_id)
        listed = self.checkpoints(owner, model_id)["checkpoints"]
        newest = {kind: None for kind in ("training", "sampler")}
        for entry in listed:
            newest[entry["checkpoint_type"]] = entry  # listed oldest first
        return {
            "training_run_id": model_id,
            "base_model": self.base.name,
            "model_owner": owner,
            "is_lora": True,
            "lora_rank": model.spec.rank if model.spec else None,
            "last_request_time": _iso(time.time()),
            "last_checkpoint": newest["training"],
            "last_sampler_checkpoint": newest["sampler"],
            "user_metadata": {k: str(v) for k, v in model.user_metadata.items()},
        }

    def checkpoints(self, owner: str, model_id: str) -> dict[str, Any]:
        """A model's checkpoints, oldest first (finished models' too)."""
        self._own_checkpoints(owner, model_id)
        entries = []
        if self.store is not None:
            for kind, label in (("weights", "training"), ("sampler_weights", "sampler")):
                folder = self.store.checkpoint_path(model_id, kind, "x").parent
                for file in folder.glob("*.pt") if folder.is_dir() else []:
                    info = file.stat()
                    name = f"{kind}/{file.stem}"
                    entries.append(
                        {
                            "checkpoint_id": name,
                            "checkpoint_type": label,
                            "time": _iso(info.st_mtime),
                            "tinker_path": f"tinker://{model_id}/{name}",
                            "size_bytes": info.st_size,
                        }
                    )
        return {"checkpoints": sorted(entries, key=lambda e: e["time"])}

    def delete_checkpoint(self, owner: str, model_id: str, checkpoint_id: str) -> None:
        self._own_checkpoints(owner, model_id)
        kind, _, name = checkpoint_id.partition("/")
        try:
            file = self.work.check_checkpoint(f"tinker://{model_id}/{kind}/{name}")
        except UserError:
            raise NotFound(f"no checkpoint {checkpoint_id!r} of {model_id!r}") from None
        file.unlink()

    def _own_checkpoints(self, owner: str, model_id: str) -> None:
        """Only a model's owner reads or deletes its checkpoints, after its session too."""
        with self._lock:
            if self._owners.get(model_id) != owner:
                raise NotFound(f"no model {model_id!r}")

    def _sampler(self, owner: str, sampler_id: str) -> SamplerSession:
        session = self.work.samplers.get(sampler_id)
        if session is None or session.owner != owner:
            raise NotFound(f"no sampling session {sampler_id!r}")
        return session

    def _model(self, owner: str, model_id: str) -> Model:
        with self._lock:
            model = self._models.get(model_id)
        if model is None or model.owner != owner:
            raise NotFound(f"no model {model_id!r}")
        with self._lock:
            if model.session_id in self._seen:
                self._seen[model.session_id] = self._clock()
        return model


def _iso(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{what} must be an integer, got {value!r}")
    return value


def _seq(body: dict[str, Any]) -> int:
    return _int(body.get("seq_id"), "seq_id")
