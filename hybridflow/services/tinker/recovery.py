"""A restarted Tinker-compatible service, rebuilt from its folder (``store.py``): sessions,
models, every accepted call under its request id, and each model as of its last acknowledged
state.

For each model, in the journal's order: made again (fresh from its spec, or from its
checkpoint), then its state file loaded (adapter, AdamW state, step count, and the ``seq_id``
of the call that wrote it). Its calls up to that ``seq_id`` keep their journaled results; the
ones after it run again, in order (a ``forward_backward`` whose gradients the crash lost is
computed again; an ``optim_step`` that never reached the state file runs now, for the first
time). So no acknowledged step is lost and none is applied twice.

``needed`` is the journal's compaction rule, what such a restart reads: every session, every
model made or dropped; a call still answered (its result retried for) or not yet held by its
model's saved state (it runs again); and a call's body only in the second case.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from hybridflow.services.tinker.operations import Operation, Operations, Result
from hybridflow.services.tinker.store import Store, decode_bytes
from hybridflow.services.tinker.work import Model, Work, journaled_payload

log = logging.getLogger("hybridflow.tinker")


def recover(
    store: Store,
    work: Work,
    operations: Operations,
    sessions: dict[str, str],
    owners: dict[str, str],
) -> None:
    """Fills ``sessions`` (the live ones) and ``owners`` (every model ever made, finished
    ones too: their checkpoints stay theirs) and restores ``work``'s models and
    ``operations``' calls."""
    records = store.records()
    done: dict[str, dict[str, Any]] = {r["rid"]: r for r in records if r["t"] == "done"}
    submits = [r for r in records if r["t"] == "submit"]
    for record in submits:
        if record["kind"] == "create_model":
            owners[record["payload"]["model_id"]] = record["owner"]
    finished = {r["id"] for r in records if r["t"] == "finish"}
    for record in records:
        if record["t"] == "session" and record["id"] not in finished:
            sessions[record["id"]] = record["owner"]
    submits = [
        r
        for r in submits
        if r["kind"] != "drop_model"
        and (r["kind"] != "create_model" or r["payload"]["session_id"] not in finished)
    ]
    saved: dict[str, int] = {}
    for record in submits:
        if record["kind"] == "create_model":
            _remake(record, done.get(record["rid"]), work, operations, saved)
    replayed = 0
    for record in submits:
        if record["kind"] == "create_model":
            continue
        model_id = record["model"]
        if model_id not in saved:  # its model was never made
            continue
        op = _operation(record)
        if record["seq"] <= saved[model_id]:
            op.result = _result(done.get(record["rid"]), record, store, model_id)
            operations.restore(op, pending=False)
        else:
            operations.restore(op, pending=True)
            replayed += 1
    log.info(
        "recovered %d sessions, %d models, %d calls (%d to run again) from %s",
        len(sessions),
        len(saved),
        len(submits),
        replayed,
        store.root,
    )


def _remake(
    record: dict[str, Any],
    finished: dict[str, Any] | None,
    work: Work,
    operations: Operations,
    saved: dict[str, int],
) -> None:
    op = _operation(record)
    if finished is not None and "error" in finished:
        op.result = Result(error=finished["error"], category=finished["category"])
        operations.restore(op, pending=False)
        return
    model_id = record["payload"]["model_id"]
    work.models[model_id] = Model.from_payload(record["owner"], record["payload"])
    op.result = work.run(op)
    operations.restore(op, pending=False)
    path = work.store.model_path(model_id) if work.store else None
    last = 0
    if path is not None and path.exists():
        state = work.store.read(path) if work.store else {}
        work.trainer.load(model_id, state, optimizer=True)
        last = int(state["seq"])
        work.models[model_id].last_saved_seq = last
    saved[model_id] = last
    operations.set_next_seq(model_id, last + 1)


def _operation(record: dict[str, Any]) -> Operation:
    return Operation(
        request_id=record["rid"],
        owner=record["owner"],
        kind=record["kind"],
        payload=journaled_payload(record["kind"], record["payload"]),
        model_id=record["model"],
        seq_id=record["seq"],
        idempotency_key=record["idem"],
    )


def _result(
    finished: dict[str, Any] | None, record: dict[str, Any], store: Store, model_id: str
) -> Result:
    """A call the model's saved state already holds: its journaled result (an ``optim_step``
    whose result line the crash cut off: the one the state file keeps)."""
    if finished is not None:
        if "error" in finished:
            return Result(error=finished["error"], category=finished["category"])
        if "proto" in finished:
            return Result(proto=decode_bytes(finished["proto"]))
        return Result(json=finished["json"])
    state = store.read(store.model_path(model_id))
    if record["kind"] == "optim_step" and int(state["seq"]) == record["seq"]:
        return Result(json={"type": "optim_step", "metrics": state["result"]})
    return Result(
        error=f"{record['kind']} seq_id {record['seq']} of {model_id} has no result after a restart",
        category="server",
    )


def needed(
    answered: set[str], saved: Mapping[str, int]
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """The compaction rule for the journal's records, in order: ``answered`` the request ids
    the service still answers, ``saved`` each live model's last saved ``seq_id``. A call is
    kept while answered or while its model's state does not hold it (and then whole: it runs
    again after a restart); the body of a held one goes. A result is kept with its call."""
    kept: set[str] = set()

    def keep(record: dict[str, Any]) -> dict[str, Any] | None:
        kind = record["t"]
        if kind in ("session", "finish"):
            return record
        if kind == "done":
            return record if record["rid"] in kept else None
        if record["kind"] in ("create_model", "drop_model") or record["seq"] is None:
            kept.add(record["rid"])
            return record
        model = record["model"]
        held = model not in saved or record["seq"] <= saved[model]
        if not held:
            kept.add(record["rid"])
            return record
        if record["rid"] not in answered:
            return None
        kept.add(record["rid"])
        return {**record, "payload": None}

    return keep
