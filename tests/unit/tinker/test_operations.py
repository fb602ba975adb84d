"""The futures queue: a model's operations run in ``seq_id`` order whatever order they arrive
in, models take turns, a retried submit runs nothing again, another owner's futures are
unknown, and the bounds refuse with the bound named. The work is a recording fake; ordering
is controlled with events, never with sleeps."""

from __future__ import annotations

import threading

import pytest

from hybridflow.errors import ResourceExhausted
from hybridflow.services.tinker.operations import Operation, Operations, Result, UserError


class Recorder:
    """Runs nothing; records each operation, and blocks while ``gate`` is clear."""

    def __init__(self) -> None:
        self.ran: list[tuple[str | None, int | None, str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, op: Operation) -> Result:
        self.gate.wait(timeout=30)
        self.ran.append((op.model_id, op.seq_id, op.kind))
        if op.kind == "fails":
            raise UserError("this one fails")
        if op.kind == "crashes":
            raise RuntimeError("boom")
        return Result(json={"kind": op.kind, "seq": op.seq_id})


@pytest.fixture
def queue():  # type: ignore[no-untyped-def]
    recorder = Recorder()
    ops = Operations(recorder, max_queued_per_model=3, max_results=100)
    yield ops, recorder
    recorder.gate.set()
    ops.close()


def _result(ops: Operations, owner: str, request_id: str) -> Result:
    result = ops.wait(owner, request_id, timeout=30)
    assert result is not None, "the operation did not finish"
    return result


def test_a_models_operations_run_in_seq_order_whatever_order_they_arrive_in(queue) -> None:  # type: ignore[no-untyped-def]
    ops, rec = queue
    ops.open_model("m")
    third = ops.submit("u", "op", None, "m", 3)
    second = ops.submit("u", "op", None, "m", 2)
    assert ops.wait("u", third, timeout=0.05) is None  # seq 1 has not come
    first = ops.submit("u", "op", None, "m", 1)
    for rid, seq in ((first, 1), (second, 2), (third, 3)):
        assert _result(ops, "u", rid).json == {"kind": "op", "seq": seq}
    assert [seq for _, seq, _ in rec.ran] == [1, 2, 3]


def test_models_take_turns_and_unordered_operations_go_first(queue) -> None:  # type: ignore[no-untyped-def]
    ops, rec = queue
    rec.gate.clear()
    ops.open_model("a")
    ops.open_model("b")
    blocker = ops.submit("u", "create", None)  # the worker holds it until the gate opens
    ids = [ops.submit("u", "op", None, m, s) for s in (1, 2) for m in ("a", "b")]
    late = ops.submit("u", "create", None)
    rec.gate.set()
    for rid in [blocker, *ids, late]:
        _result(ops, "u", rid)
    models = [m for m, _, kind in rec.ran if kind == "op"]
    assert rec.ran[1][2] == "create"  # the unordered one did not wait behind the models
    assert models in (["a", "b", "a", "b"], ["b", "a", "b", "a"])


def test_a_retried_submit_returns_the_first_request_and_runs_once(queue) -> None:  # type: ignore[no-untyped-def]
    ops, rec = queue
    ops.open_model("m")
    first = ops.submit("u", "op", None, "m", 1, idempotency_key="k1")
    assert ops.submit("u", "op", None, "m", 1, idempotency_key="k1") == first
    assert ops.submit("u", "op", None, "m", 1, idempotency_key="another") == first
    _result(ops, "u", first)
    assert ops.submit("u", "op", None, "m", 1) == first  # after it ran, still the same answer
    _result(ops, "u", ops.submit("u", "op", None, "m", 2))
    assert [seq for _, seq, _ in rec.ran] == [1, 2]


def test_another_owners_future_is_unknown(queue) -> None:  # type: ignore[no-untyped-def]
    ops, _ = queue
    ops.open_model("m")
    rid = ops.submit("alice", "op", None, "m", 1)
    _result(ops, "alice", rid)
    with pytest.raises(KeyError):
        ops.wait("bob", rid, timeout=0)


def test_failures_become_error_results_and_the_worker_goes_on(queue) -> None:  # type: ignore[no-untyped-def]
    ops, _ = queue
    ops.open_model("m")
    user = _result(ops, "u", ops.submit("u", "fails", None, "m", 1))
    server = _result(ops, "u", ops.submit("u", "crashes", None, "m", 2))
    after = _result(ops, "u", ops.submit("u", "op", None, "m", 3))
    assert (user.error, user.category) == ("this one fails", "user")
    assert server.category == "server" and "boom" in (server.error or "")
    assert after.json == {"kind": "op", "seq": 3}


def test_bounds_and_stale_or_unknown_submits_are_refused_by_name(queue) -> None:  # type: ignore[no-untyped-def]
    ops, _ = queue
    ops.open_model("m")
    for seq in (2, 3):  # waiting for seq 1; the window of 3 is seq 1-3
        ops.submit("u", "op", None, "m", seq)
    with pytest.raises(ResourceExhausted, match="bound of 3 operations"):
        ops.submit("u", "op", None, "m", 4)
    with pytest.raises(UserError, match="no model 'x'"):
        ops.submit("u", "op", None, "x", 1)
    _result(ops, "u", ops.submit("u", "op", None, "m", 1))  # the one that unblocks always fits
    _result(ops, "u", ops.submit("u", "op", None, "m", 4))


def test_a_seq_id_that_ran_under_a_forgotten_request_is_refused() -> None:
    ops = Operations(Recorder(), max_results=1)
    try:
        ops.open_model("m")
        _result(ops, "u", ops.submit("u", "op", None, "m", 1))
        _result(ops, "u", ops.submit("u", "op", None, "m", 2))  # seq 1's result is dropped
        with pytest.raises(UserError, match="seq_id 1 of model 'm' already ran"):
            ops.submit("u", "op", None, "m", 1)
    finally:
        ops.close()


def test_queued_samples_run_in_batches_across_samplers_in_each_ones_order() -> None:
    """Samples of two samplers queued before the worker starts run in batches of at most
    three (the turn's sampler first, then the other's), each sampler's in arrival order and
    each call with its own result; a call of another kind queued among them runs alone, in
    its place; a failed batch fails each of its calls."""
    batches: list[list[str]] = []

    def run_batch(batch: list[Operation]) -> list[Result]:
        batches.append([op.payload for op in batch])
        if any(op.payload == "bad" for op in batch):
            raise RuntimeError("the batch broke")
        return [Result(json={"payload": op.payload}) for op in batch]

    recorder = Recorder()
    ops = Operations(
        recorder, run_batch=run_batch, batch_kinds=frozenset({"sample"}), max_batch=3, start=False
    )
    a = [ops.submit("u", "sample", f"a{i}", "sampler:a") for i in range(4)]
    b = [ops.submit("u", "sample", f"b{i}", "sampler:b") for i in range(2)]
    lone = ops.submit("u", "other", "x", "sampler:a")
    behind = [ops.submit("u", "sample", p, "sampler:a") for p in ("bad", "a5")]
    ops.start()
    try:
        results = {rid: _result(ops, "u", rid) for rid in [*a, *b, lone, *behind]}
    finally:
        ops.close()
    for rid, payload in [*zip(a, [f"a{i}" for i in range(4)]), *zip(b, ["b0", "b1"])]:
        assert results[rid].json == {"payload": payload}
    assert results[lone].json == {"kind": "other", "seq": None}  # by ``run``, alone
    assert all("RuntimeError: the batch broke" in str(results[r].error) for r in behind)
    assert all(len(batch) <= 3 for batch in batches)
    assert any({"a", "b"} <= {p[0] for p in batch} for batch in batches)  # two samplers, one batch
    order = [p for batch in batches for p in batch]
    assert [p for p in order if p in ("b0", "b1")] == ["b0", "b1"]
    assert [p for p in order if p[0] == "a" or p == "bad"] == ["a0", "a1", "a2", "a3", "bad", "a5"]
    assert ["bad", "a5"] in batches  # the other kind held them back to their own batch


def test_a_sampling_sessions_queue_is_bounded_and_the_refusal_names_the_bound() -> None:
    ops = Operations(Recorder(), max_queued_per_key=2, start=False)
    for _ in range(2):
        ops.submit("u", "sample", {}, "sampler:a")
    with pytest.raises(
        ResourceExhausted, match="2 calls already wait under 'sampler:a': at most 2"
    ):
        ops.submit("u", "sample", {}, "sampler:a")
    ops.submit("u", "sample", {}, "sampler:b")  # another session's queue is its own
    ops.start()
    ops.close()
