"""A publish beside the next train step on 2 FSDP learner ranks (gloo): ``start_publish``
relayed to both ranks, the next ``train_step`` relayed while both ranks' background sends are
pending or running over the weight-sync group, then rank 0's ``finish_publish``. The replica
(a ``DistReceiver`` in rank 0's process) must hold exactly the weights of the started
version, never the step's after; the next publish settles the previous on both ranks.

The first overlapped publish is held on each rank behind a gate that opens only after the
next train step (its optimizer step) has run there, so the snapshot is what is tested, not
the threads' timing; the second runs ungated, beside the train step's FSDP collectives."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import build_tiny_checkpoint, learner_config
from tests.integration.test_critic_ranks import WEIGHT_SYNC, InProcessReplica
from tests.integration.test_fsdp_parity import (
    _free_port,
    _join_group,
    _leave_group,
    _samples,
    _spawn,
)

FIELDS: dict[str, Any] = {"algorithm": "grpo", "optimizer": {"lr": 1e-2}}
TARGETS = (["replica0"],)

# Two spawned ranks, ~20-40 s: the single-rank paths run in the default suite
# (tests/unit/weights/test_background_send.py, tests/unit/coordinator/test_background_publish.py).
pytestmark = pytest.mark.slow


def _gated(core: Any) -> Any:
    """The relay's handler plus two test commands run on every rank: ``gate`` queues a
    wait in front of this rank's next background send, ``open`` releases it."""
    gate = threading.Event()

    def handle(command: str, payload: Any) -> Any:
        if command == "gate":
            gate.clear()
            return core._publisher._sender.submit(gate.wait, 60.0)
        if command == "open":
            gate.set()
            return None
        return core.dispatch(command, payload)

    return handle


def _commands(call: Any, core: Any, replica: InProcessReplica) -> dict[str, Any]:
    def weights() -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in call("full_weights", ())}

    out: dict[str, Any] = {}
    call("train_step", (_samples(),))
    out["v1"] = weights()
    out["publish_v1"] = call("publish_weights", TARGETS).policy_version
    out["received_v1"] = dict(replica.received)

    call("train_step", (list(reversed(_samples())),))
    out["v2"] = weights()
    call("gate", ())
    out["started_v2"] = call("start_publish", TARGETS)
    out["trained_beside_v2"] = call("train_step", (_samples(),)).policy_version
    call("open", ())
    out["finish_v2"] = core.finish_publish().policy_version
    out["received_v2"] = dict(replica.received)

    out["v3"] = weights()
    out["started_v3"] = call("start_publish", TARGETS)  # settles v2 on both ranks first
    out["trained_beside_v3"] = call("train_step", (list(reversed(_samples())),)).policy_version
    out["finish_v3"] = core.finish_publish().policy_version
    out["received_v3"] = dict(replica.received)

    out["v4"] = weights()
    out["publish_v4"] = call("publish_weights", TARGETS).policy_version
    out["received_v4"] = dict(replica.received)
    return out


def _rank_main(rank: int, port: int, ckpt: str, out_dir: str) -> None:
    _join_group(rank, port)
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.distributed import CommandRelay
    from hybridflow.services.learner.worker import LearnerWorker

    worker = LearnerWorker(learner_config(FIELDS), ckpt)
    replica = InProcessReplica(Path(ckpt))
    core = LearnerCore(worker, rank, WEIGHT_SYNC, lambda _target: replica)
    relay = CommandRelay(_gated(core))
    if rank == 0:
        results = _commands(relay.call, core, replica)
        relay.shutdown()
        torch.save(results, Path(out_dir) / "results.pt")
    else:
        relay.serve()
    _leave_group()


def test_a_publish_beside_the_next_train_step_on_two_ranks_sends_its_own_version(
    tmp_path: Path,
) -> None:
    torch.set_num_threads(1)
    ckpt = build_tiny_checkpoint(tmp_path / "tiny")
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path)))
    got = torch.load(tmp_path / "results.pt", weights_only=False)
    assert got["publish_v1"] == 1
    assert (got["started_v2"], got["trained_beside_v2"], got["finish_v2"]) == (2, 3, 2)
    assert (got["started_v3"], got["trained_beside_v3"], got["finish_v3"]) == (3, 4, 3)
    assert got["publish_v4"] == 4
    for version in (1, 2, 3, 4):
        sent, held = got[f"v{version}"], got[f"received_v{version}"]
        assert held and set(held) <= set(sent)  # tied weights travel once
        for name, tensor in held.items():
            torch.testing.assert_close(tensor, sent[name], rtol=0, atol=0, msg=name)
    # Each publish carried new weights (the train steps changed them).
    assert any(not torch.equal(t, got["v3"][n]) for n, t in got["received_v2"].items())
    assert any(not torch.equal(t, got["v2"][n]) for n, t in got["received_v1"].items())
