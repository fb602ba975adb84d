"""Delta syncs (``weight_sync.delta``, ``weights/transport/delta.py``): after a group's first
sync the learner sends only the elements that changed, and every replica ends bit-equal to a
full sync, two replicas each through its own group against its own base; a replica whose
group was closed (it left the serving set) starts again with a full sync, while the other
replica's group goes on sending deltas.

A real weight-sync group over gloo sockets (shared memory off: in one process every pair is
on one host): learner rank 0 and two in-process ``DistReceiver``s, the planner executor."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.dist_formation import param_table
from hybridflow.weights.dist_publisher import DistPublisher
from hybridflow.weights.dist_receiver import DistReceiver

WAIT_S = 30.0


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 8))


@pytest.mark.parametrize("changed", [3, 10_000])
def test_every_replica_ends_equal_to_the_learner_after_each_delta(
    changed: int, caplog: pytest.LogCaptureFixture
) -> None:
    """``changed``: elements moved per step: a few (the delta carries indices and values) or
    all of them (every slice goes whole, and the job is told once that delta gains nothing)."""
    caplog.set_level(logging.WARNING, "hybridflow.weights.dist_publisher")
    model = _model()
    receivers = {t: DistReceiver(param_table(model), torch.device("cpu")) for t in ("r0", "r1")}
    config = WeightSyncConfig(transport="dist", timeout_s=WAIT_S, shared_memory="off", delta=True)
    publisher = DistPublisher(config, 0, 1, model, torch.device("cpu"))
    received: dict[str, dict[str, torch.Tensor]] = {}

    def receive(target: str, version: int) -> int:
        tensors, num_bytes = receivers[target].receive()
        received[target] = dict(tensors)
        return num_bytes

    def join(target: str, spec, index: int) -> str:  # type: ignore[no-untyped-def]
        return receivers[target].join(spec, index)

    full_bytes = sum(p.numel() * 4 for p in model.parameters())
    generator = torch.Generator().manual_seed(1)
    try:
        for version in range(1, 6):
            targets = ["r0", "r1"]
            if version == 5:
                publisher.retire(["r0"])  # r1 left the serving set: its group is closed
            report = publisher.publish_with(targets, version, join, receive)
            for target in targets:
                delta = publisher._lanes[target].executor.last_delta
                if version == 1 or (version == 5 and target == "r1"):  # a group's first: full
                    assert delta is None
                else:
                    assert delta is not None
                    if changed == 3:
                        assert delta.num_changed == 3  # the same 3 elements, to each replica
            if version == 1:
                assert report.num_bytes == full_bytes
            elif version == 5:  # the largest receive: r1's full one, or r0's all-whole delta
                assert full_bytes <= report.num_bytes <= full_bytes + 64
            else:
                assert report.num_bytes <= full_bytes + 64
                if changed == 3:
                    assert report.num_bytes < full_bytes // 10
            for target in targets:
                for name, param in model.named_parameters():
                    assert torch.equal(received[target][name], param.detach()), (target, name)
            with torch.no_grad():  # the next step moves ``changed`` elements
                flat = torch.cat([p.reshape(-1) for p in model.parameters()])
                picked = torch.randperm(flat.numel(), generator=generator)[:changed]
                flat[picked] += 0.01
                offset = 0
                for p in model.parameters():
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
        assert publisher._generation == 3  # r0's group was never formed again
        warnings = [r for r in caplog.records if "weight_sync.delta: false" in r.getMessage()]
        assert len(warnings) == (1 if changed == 10_000 else 0)
    finally:
        publisher.close()
        for receiver in receivers.values():
            receiver.close()
