"""What each accepted call of the Tinker-compatible service does on the tenant engine, one at a
time on the operations worker: make a model (fresh or from a checkpoint), forward/backward, an
AdamW step (its state written before its result is told), save and load checkpoints.

``tinker://<model_id>/weights/<name>`` is a training state (adapter, AdamW state, step count);
``tinker://<model_id>/sampler_weights/<name>`` an adapter alone.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybridflow.errors import BadRequest
from hybridflow.services.learner.tenants import AdamParams, AdapterSpec, TenantTrainer
from hybridflow.services.tinker.convert import (
    decode_forward_backward,
    encode_forward_backward,
    encode_sample,
)
from hybridflow.services.tinker.operations import Operation, Result, UserError
from hybridflow.services.tinker.sampler import (
    SampleParams,
    SampleRequest,
    check,
    prompt_logprobs,
    sample_many,
)
from hybridflow.services.tinker.store import Store, decode_bytes

CHECKPOINT_KINDS = {"save_weights": "weights", "save_weights_for_sampler": "sampler_weights"}


class NotFound(KeyError):
    """No such session, model, checkpoint or future for this owner."""


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
class Model:
    """One training client's model: whose, and how it is made (a spec, or a checkpoint)."""

    owner: str
    session_id: str
    spec: AdapterSpec | None
    load: dict[str, Any] | None = None
    user_metadata: dict[str, Any] = field(default_factory=dict)
    created: bool = False
    last_saved_seq: int = 0
    """The ``seq_id`` of the call whose state the model's state file holds (0: none)."""

    @classmethod
    def from_payload(cls, owner: str, payload: dict[str, Any]) -> Model:
        spec = payload.get("spec")
        return cls(
            owner=owner,
            session_id=payload["session_id"],
            spec=AdapterSpec(**spec) if spec else None,
            load=payload.get("load"),
            user_metadata=payload.get("user_metadata") or {},
        )


def parse_path(path: str) -> tuple[str, str, str]:
    """``(model_id, kind, name)`` of ``tinker://<model_id>/<kind>/<name>``."""
    rest = path.removeprefix("tinker://")
    parts = rest.split("/")
    if rest == path or len(parts) != 3 or parts[1] not in CHECKPOINT_KINDS.values():
        raise UserError(
            f"checkpoint path {path!r}: expected tinker://<model_id>/weights/<name> "
            "or tinker://<model_id>/sampler_weights/<name>"
        )
    return parts[0], parts[1], parts[2]


@dataclass
class SamplerSession:
    """What a sampling session samples with: the base (neither set), a sampler checkpoint
    (``model_path``) or an adapter snapshot taken by an unnamed ``save_weights_for_sampler``
    (kept in memory only)."""

    owner: str
    model_path: str | None = None
    snapshot: dict[str, Any] | None = None

    @property
    def adapter(self) -> bool:
        return self.model_path is not None or self.snapshot is not None


@dataclass
class Tokens:
    """What sampling needs of the tokenizer: the EOS ids and the text of some ids."""

    eos_ids: set[int]
    decode: Callable[[list[int]], str]


class Work:
    """Runs operations on ``trainer``; ``models`` and ``samplers`` are the service's tables
    (shared)."""

    def __init__(
        self,
        trainer: TenantTrainer,
        store: Store | None,
        models: dict[str, Model],
        tokens: Tokens | None = None,
    ):
        self.trainer = trainer
        self.store = store
        self.models = models
        self.tokens = tokens or Tokens(set(), lambda ids: "")
        self.samplers: dict[str, SamplerSession] = {}
        self._lock = threading.Lock()

    def new_sampler(self, session: SamplerSession) -> str:
        sampler_id = uuid.uuid4().hex
        with self._lock:
            self.samplers[sampler_id] = session
        return sampler_id

    def run(self, op: Operation) -> Result:
        if op.kind == "create_model":
            return self._create(op.payload)
        if op.kind == "sample":
            return self.run_batch([op])[0]
        if op.kind == "drop_model":
            if op.payload in self.trainer.names:
                self.trainer.drop(op.payload)
            return Result(json={})
        assert op.model_id is not None and op.seq_id is not None
        if op.kind == "forward_backward":
            call = decode_forward_backward(op.payload)
            logprobs, metrics = self.trainer.forward_backward(
                call.model_id, call.datums, call.loss_fn, call.config, call.forward_only
            )
            return Result(proto=encode_forward_backward(logprobs, metrics))
        if op.kind == "optim_step":
            metrics = self.trainer.optim_step(op.model_id, AdamParams(**op.payload))
            self._save_model(op.model_id, op.seq_id, metrics)
            return Result(json={"type": "optim_step", "metrics": metrics})
        if op.kind in CHECKPOINT_KINDS:
            return self._save_checkpoint(op)
        if op.kind == "load_weights":
            state = self._read_checkpoint(op.payload["path"])
            self.trainer.load(op.model_id, state, optimizer=op.payload["optimizer"])
            self._save_model(op.model_id, op.seq_id, {})
            return Result(json={"type": "load_weights", "path": op.payload["path"]})
        raise UserError(f"{op.kind} is not served by this service yet (docs/tinker.md)")

    def _create(self, payload: dict[str, Any]) -> Result:
        model_id = payload["model_id"]
        model = self.models.get(model_id)
        if model is None:
            raise UserError(f"model {model_id!r} was finished with its session")
        if not model.created:
            if model.load is None:
                assert model.spec is not None
                self.trainer.create(model_id, model.spec)
            else:
                state = self._read_checkpoint(model.load["path"])
                model.spec = AdapterSpec(**state["spec"])
                self.trainer.create(model_id, model.spec)
                try:
                    self.trainer.load(model_id, state, optimizer=model.load["optimizer"])
                except Exception:
                    self.trainer.drop(model_id)
                    raise
            model.created = True
        if model.load is None:
            return Result(json={"type": "create_model", "model_id": model_id})
        return Result(
            json={"type": "load_weights", "model_id": model_id, "path": model.load["path"]}
        )

    def _save_model(self, model_id: str, seq_id: int, result: dict[str, float]) -> None:
        """The model's state after call ``seq_id``, on disk before the call's result is told."""
        if self.store is None:
            return
        state = self.trainer.state(model_id)
        state.update(seq=seq_id, result=result)
        self.store.write(self.store.model_path(model_id), state)
        self.models[model_id].last_saved_seq = seq_id

    def _save_checkpoint(self, op: Operation) -> Result:
        assert op.model_id is not None
        kind = CHECKPOINT_KINDS[op.kind]
        name = op.payload["name"]
        if name is None:
            if op.kind != "save_weights_for_sampler":
                raise UserError("save_weights needs a name (path)")
            snapshot = self.trainer.state(op.model_id, optimizer=False)
            sampler_id = self.new_sampler(SamplerSession(op.owner, snapshot=snapshot))
            return Result(json={"type": op.kind, "sampling_session_id": sampler_id})
        store = self._need_store(op.kind)
        try:
            path = store.checkpoint_path(op.model_id, kind, str(name))
        except ValueError as exc:
            raise UserError(str(exc)) from None
        saved_by = f"{op.model_id}@{op.seq_id}"
        if path.exists() and not op.payload["overwrite"]:
            if store.read(path).get("saved_by") != saved_by:  # else: this call, run again
                raise UserError(f"checkpoint {kind}/{name} exists (overwrite is false)")
        state = self.trainer.state(op.model_id, optimizer=kind == "weights")
        state["saved_by"] = saved_by
        store.write(path, state)
        return Result(json={"type": op.kind, "path": f"tinker://{op.model_id}/{kind}/{name}"})

    def check_checkpoint(self, path: str) -> Path:
        """The file of checkpoint ``path``; a ``UserError`` if there is none."""
        model_id, kind, name = parse_path(path)
        store = self._need_store("a checkpoint")
        try:
            file = store.checkpoint_path(model_id, kind, name)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if not file.exists():
            raise UserError(f"no checkpoint {path!r}")
        return file

    def _read_checkpoint(self, path: str) -> dict[str, Any]:
        assert self.store is not None
        return self.store.read(self.check_checkpoint(path))

    def run_batch(self, ops: list[Operation]) -> list[Result]:
        """Samples, of one sampling session or several (many tenants'), as one batch
        (``sample_many``), each row with its session's adapter; a call the model cannot serve
        fails alone. More sessions with adapters than the model holds at once: in turns."""
        results: list[Result | None] = [None] * len(ops)
        pending: list[tuple[int, SampleRequest]] = []
        for i, op in enumerate(ops):
            assert op.kind == "sample", op.kind
            payload = op.payload
            request = SampleRequest(
                np.asarray(payload["prompt"], dtype=np.int64),
                payload["num_samples"],
                SampleParams.from_json(payload["params"]),
            )
            try:
                check(self.trainer.model, request)
            except BadRequest as exc:
                results[i] = Result(error=str(exc), category="user")
                continue
            pending.append((i, request))
        while pending:
            turn: list[tuple[int, SampleRequest]] = []
            samplers: set[str] = set()  # at most as many as the model holds adapters
            for i, request in pending:
                sampler = ops[i].payload["sampler"]
                if sampler in samplers or len(samplers) < self.trainer.max_frozen:
                    samplers.add(sampler)
                    turn.append((i, request))
            taken = {i for i, _ in turn}
            pending = [(i, r) for i, r in pending if i not in taken]
            names = {s: self._sampling_adapter(s, keep=samplers) for s in samplers}
            rows = [names[ops[i].payload["sampler"]] for i, r in turn for _ in range(r.num_samples)]
            with self.trainer.using_by_row(rows):
                batched = sample_many(
                    self.trainer.model,
                    [r for _, r in turn],
                    self.tokens.eos_ids,
                    self.tokens.decode,
                )
            for (i, request), completions in zip(turn, batched, strict=True):
                lps = None
                if ops[i].payload["prompt_logprobs"]:
                    with self.trainer.using(names[ops[i].payload["sampler"]]):
                        lps = prompt_logprobs(self.trainer.model, request.prompt)
                sequences = [(c.tokens, c.logprobs, c.stopped) for c in completions]
                results[i] = Result(proto=encode_sample(sequences, lps))
        return [r for r in results if r is not None]

    def _sampling_adapter(self, sampler_id: str, keep: set[str]) -> str | None:
        """The frozen adapter sampler ``sampler_id`` samples with (None: the base), made
        from its snapshot or checkpoint if it is not resident (the oldest one not of a
        sampler in ``keep`` leaves)."""
        session = self.samplers[sampler_id]
        adapter = f"sampler-{sampler_id}" if session.adapter else None
        if adapter is not None and adapter not in self.trainer.frozen:
            if len(self.trainer.frozen) >= self.trainer.max_frozen:
                kept = {f"sampler-{s}" for s in keep}
                self.trainer.remove_frozen(next(a for a in self.trainer.frozen if a not in kept))
            if session.snapshot is not None:
                state = session.snapshot
            else:
                assert session.model_path is not None
                state = self._read_checkpoint(session.model_path)
            self.trainer.add_frozen(adapter, state)
        return adapter

    def _need_store(self, what: str) -> Store:
        if self.store is None:
            raise UserError(
                f"{what}: this service keeps no checkpoints (start it with --state-dir)"
            )
        return self.store


def journaled_payload(kind: str, payload: Any) -> Any:
    """A journal record's payload as ``run`` takes it (a forward_backward body is base64;
    None where compaction dropped it: the call is done and never runs again)."""
    if kind == "forward_backward" and payload is not None:
        return decode_bytes(payload["body"])
    return payload
