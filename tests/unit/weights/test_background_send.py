"""``DistPublisher.start`` / ``finish``: the send runs on a background thread from a
snapshot of the shards taken in ``start``, so an optimizer step right after ``start`` (an
in-place change of the parameters) never reaches the replica; ``finish`` reports the
version once the replica has received it; the next publish settles the previous one. The
snapshot's buffers are allocated once and refilled at each start, unless a send still reads
them.

A real weight-sync group over gloo (learner rank 0 and one in-process ``DistReceiver``, the
planner executor). The background send is held behind a gate the test opens, so the
parameters change before it runs, whatever the threads' timing."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
import torch
from torch import nn

from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.dist_formation import param_table
from hybridflow.weights.dist_publisher import DistPublisher
from hybridflow.weights.dist_receiver import DistReceiver

WAIT_S = 30.0


@pytest.mark.parametrize("executor", ["planner", "naive"])
def test_the_background_send_carries_the_weights_of_start_not_later_ones(executor: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    receiver = DistReceiver(param_table(model), torch.device("cpu"))
    publisher = DistPublisher(
        WeightSyncConfig(transport="dist", executor=executor, timeout_s=WAIT_S),
        0,
        1,
        model,
        torch.device("cpu"),
    )
    received: dict[int, dict[str, torch.Tensor]] = {}
    buffers: dict[int, dict[str, torch.Tensor]] = {}  # held: a fresh one would be elsewhere

    def receive(target: str, version: int) -> int:
        tensors, num_bytes = receiver.receive()
        received[version] = dict(tensors)
        return num_bytes

    def join(target: str, spec, index: int) -> str:  # type: ignore[no-untyped-def]
        return receiver.join(spec, index)

    try:
        for version in (1, 2):
            expected = {n: p.detach().clone() for n, p in model.named_parameters()}
            gate = threading.Event()
            publisher._sender.submit(gate.wait, WAIT_S)  # the send queues behind the gate
            publisher.start_with(["r0"], version, join, receive)
            buffers[version] = dict(publisher._snapshots)
            with torch.no_grad():  # the next optimizer step, while the send waits
                for p in model.parameters():
                    p.add_(1.0)
            gate.set()
            report = publisher.finish()
            assert report.policy_version == version and report.num_bytes > 0
            assert received[version].keys() == expected.keys()
            for name, tensor in expected.items():
                torch.testing.assert_close(received[version][name], tensor, rtol=0, atol=0)
        with pytest.raises(RuntimeError, match="no publish in flight"):
            publisher.finish()  # each publish is reported once
        assert buffers[1].keys() == expected.keys()
        first = {n: t.data_ptr() for n, t in buffers[1].items()}
        # the second start refilled the first one's buffers
        assert {n: t.data_ptr() for n, t in buffers[2].items()} == first
        publisher._snapshot_reader = Future()  # a send that never ended still reads them
        fresh = {n: t.data_ptr() for n, t in publisher._snapshot().items()}
        assert not set(fresh.values()) & set(first.values())
    finally:
        publisher.close()
        receiver.close()
