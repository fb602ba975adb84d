"""A restarted Tinker-compatible service, rebuilt from its folder: what a crash at each point
leaves behind comes back with no acknowledged step lost and none applied twice. Each "crash"
abandons the service object and, where the crash point needs it, cuts the journal or the state
file back to what the disk would hold at that moment; the restart is a new service (a new
model load) on the same folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tinker import types
from tinker.proto import request_conv, response_conv
from transformers import AutoModelForCausalLM

from hybridflow.models import resolve_model_path
from hybridflow.services.learner.tenants import TenantTrainer
from hybridflow.services.tinker.operations import UserError
from hybridflow.services.tinker.service import ServedBase, TinkerService
from hybridflow.services.tinker.store import JOURNAL, Store

BASE = "builtin:tiny-qwen3"
ADAM = {"learning_rate": 2e-2}


def _service(folder: Path, **options: Any) -> TinkerService:
    path = resolve_model_path(BASE)
    trainer = TenantTrainer(AutoModelForCausalLM.from_pretrained(path).eval())
    return TinkerService(trainer, ServedBase(BASE, str(path)), Store(folder), **options)


def _body(model_id: str, seq_id: int) -> bytes:
    rng = np.random.default_rng(4)
    data = []
    for n in (6, 9):
        tokens = rng.integers(0, 200, n + 1).tolist()
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * n},
            )
        )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=seq_id,
    )
    return request_conv.forward_backward_request_to_proto(request).SerializeToString()


class Client:
    """A user's loop against one service, by hand: its own seq_ids."""

    def __init__(self, service: TinkerService, model_id: str | None = None) -> None:
        self.service = service
        if model_id is None:
            session = service.create_session("u")
            body = {"session_id": session, "model_seq_id": 0, "base_model": BASE}
            body["lora_config"] = {"rank": 4, "seed": 1}
            model_id = self.result(service.create_model("u", body, None))["model_id"]
        self.model_id = model_id

    def result(self, request_id: str) -> dict:  # type: ignore[type-arg]
        out = self.service.retrieve("u", request_id, timeout=60)
        assert out is not None and out.error is None, out
        return out.json if out.json is not None else {"proto": out.proto}

    def fwdbwd(self, seq: int) -> str:
        return self.service.forward_backward("u", _body(self.model_id, seq), None)

    def optim(self, seq: int) -> str:
        body = {"model_id": self.model_id, "seq_id": seq, "adam_params": ADAM}
        return self.service.optim_step("u", body, None)

    def loss(self, request_id: str) -> float:
        out = response_conv.deserialize_forward_backward_output(self.result(request_id)["proto"])
        return float(out.metrics["loss:sum"])

    def step_count(self, request_id: str) -> int:
        return int(self.result(request_id)["metrics"]["step:max"])


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """Losses of seq 1, 3, 5, 7, 9 of an uninterrupted run (fwd/bwd odd, optim even)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        client = Client(_service(Path(folder)))
        losses = []
        for seq in range(1, 10, 2):
            losses.append(client.loss(client.fwdbwd(seq)))
            client.step_count(client.optim(seq + 1))
        client.service.close()
        return losses


def _cut_journal_after(folder: Path, request_id: str, kind: str) -> None:
    """The journal as it was just before the ``kind`` record of ``request_id`` was written."""
    lines = (folder / JOURNAL).read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if f'"rid":"{request_id}"' in line and f'"t":"{kind}"' in line:
            (folder / JOURNAL).write_text("".join(lines[:i]))
            return
    raise AssertionError(f"no {kind} record of {request_id}")


def test_lost_gradients_are_computed_again_and_steps_are_kept(
    tmp_path: Path, reference: list[float]
) -> None:
    client = Client(_service(tmp_path))
    for seq in (1, 3):
        client.loss(client.fwdbwd(seq))
        client.step_count(client.optim(seq + 1))
    fwdbwd = client.fwdbwd(5)
    client.loss(fwdbwd)  # acknowledged: its gradients are in memory only
    restarted = Client(_service(tmp_path), client.model_id)  # the crash: the first is dropped
    assert restarted.loss(fwdbwd) == pytest.approx(reference[2], rel=1e-6)
    assert restarted.step_count(restarted.optim(6)) == 3
    assert restarted.loss(restarted.fwdbwd(7)) == pytest.approx(reference[3], rel=1e-6)


def test_a_step_on_disk_whose_result_line_was_cut_is_not_applied_again(
    tmp_path: Path, reference: list[float]
) -> None:
    client = Client(_service(tmp_path))
    client.loss(client.fwdbwd(1))
    optim = client.optim(2)
    assert client.step_count(optim) == 1
    _cut_journal_after(tmp_path, optim, "done")  # state written, result line not
    restarted = Client(_service(tmp_path), client.model_id)
    assert restarted.step_count(optim) == 1
    assert restarted.optim(2) == optim  # the SDK's retry: the same call, not a second step
    assert restarted.loss(restarted.fwdbwd(3)) == pytest.approx(reference[1], rel=1e-6)
    assert restarted.step_count(restarted.optim(4)) == 2


def test_an_accepted_step_that_never_ran_runs_once_after_the_restart(
    tmp_path: Path, reference: list[float]
) -> None:
    client = Client(_service(tmp_path))
    client.loss(client.fwdbwd(1))
    client.step_count(client.optim(2))
    client.loss(client.fwdbwd(3))
    optim = client.optim(4)
    client.step_count(optim)
    # back to the disk of a crash after step 4 was accepted, before it ran
    _cut_journal_after(tmp_path, optim, "done")
    state = Store(tmp_path)
    before = _service_state_after_step_one(tmp_path, client.model_id)
    state.write(state.model_path(client.model_id), before)
    restarted = Client(_service(tmp_path), client.model_id)
    assert restarted.step_count(optim) == 2
    assert restarted.loss(restarted.fwdbwd(5)) == pytest.approx(reference[2], rel=1e-6)


def _service_state_after_step_one(folder: Path, model_id: str) -> dict:  # type: ignore[type-arg]
    """The model's state file as step 1 (seq 2) wrote it, by running that far again."""
    import tempfile

    with tempfile.TemporaryDirectory() as other:
        replay = Client(_service(Path(other)))
        replay.loss(replay.fwdbwd(1))
        replay.step_count(replay.optim(2))
        store = Store(other)
        return store.read(store.model_path(replay.model_id))


def test_a_finished_sessions_models_free_their_places_and_stay_gone_after_a_restart(
    tmp_path: Path,
) -> None:
    service = _service(tmp_path)
    service.work.trainer.max_tenants = 1
    first = Client(service)
    session = first.model_id.split(":")[0]
    service.finish_session("u", session)
    second = Client(service)  # the one place is free again
    assert second.step_count(second.optim(1)) == 1
    restarted = _service(tmp_path)
    assert restarted.work.trainer.names == [second.model_id]
    with pytest.raises(KeyError, match="no model"):
        restarted.get_info("u", first.model_id)


class Clock:
    """Time that moves only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_session_is_finished_and_an_active_one_is_kept(tmp_path: Path) -> None:
    clock = Clock()
    service = _service(tmp_path, session_timeout_s=100.0, clock=clock)
    idle, busy, beating = Client(service), Client(service), Client(service)
    clock.now += 60
    busy.step_count(busy.optim(1))  # a call counts as activity
    service.heartbeat("u", beating.model_id.split(":")[0])  # so does a heartbeat
    clock.now += 60  # idle: 120 s without either; the others 60 s
    assert service.expire_idle() == [idle.model_id.split(":")[0]]
    with pytest.raises(KeyError, match="no model"):
        service.get_info("u", idle.model_id)
    assert busy.step_count(busy.optim(2)) == 2
    assert sorted(service.work.trainer.names) == sorted([busy.model_id, beating.model_id])
    restarted = _service(tmp_path, session_timeout_s=100.0, clock=clock)
    assert idle.model_id not in restarted.work.trainer.names  # finished for good


def test_a_compacted_journal_keeps_what_a_restart_needs_and_nothing_runs_twice(
    tmp_path: Path, reference: list[float]
) -> None:
    """Compacted after every result (a 1-byte bound), answering only its newest four calls:
    the journal keeps those four (bodies dropped where the saved state holds the call) and the
    acknowledged forward_backward after the last step whole; a restart from it replays that
    one, answers a kept call's retry with its first id and refuses a dropped one's."""
    service = _service(tmp_path, compact_journal_bytes=1)
    service.operations.max_results = 4
    client = Client(service)
    first = client.fwdbwd(1)
    client.loss(first)
    client.step_count(client.optim(2))
    client.loss(client.fwdbwd(3))
    optim = client.optim(4)
    client.step_count(optim)
    pending = client.fwdbwd(5)  # acknowledged, its gradients not yet in a saved state
    client.loss(pending)
    calls = [
        (r["seq"], r["payload"] is not None)
        for r in Store(tmp_path).records()
        if r["t"] == "submit" and r["kind"] != "create_model"
    ]
    assert calls == [(2, False), (3, False), (4, False), (5, True)]

    restarted = Client(_service(tmp_path), client.model_id)  # the crash: the first is dropped
    assert restarted.loss(pending) == pytest.approx(reference[2], rel=1e-6)
    assert restarted.optim(4) == optim and restarted.step_count(optim) == 2
    with pytest.raises(UserError, match="seq_id 1 .* already ran"):
        restarted.fwdbwd(1)
    assert restarted.step_count(restarted.optim(6)) == 3
    assert restarted.loss(restarted.fwdbwd(7)) == pytest.approx(reference[3], rel=1e-6)
