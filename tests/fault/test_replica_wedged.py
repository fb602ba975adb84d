"""A wedged engine behind a server that still answers is a failed replica (issue 27, rows 6
and 8): a real HF-engine rollout server (the tiny model, over gRPC) whose engine blocks forever
in its first forward, next to a healthy fake replica. Its GetInfo keeps answering at once, so
"any answer is life" would hold the request until the channel's deadline (120 s); with the
engine-progress rule (``coordinator/liveness.py``) the replica leaves dispatch once its
``engine_steps`` stood still for ``replica_stall_timeout_s`` while it held the request, the
log names it, and the job finishes on the healthy one with every prompt trained exactly once.

Time is the test's: silence is measured on a fake clock that moves one probe interval per
probe of the wedged replica's dispatcher (the real interval between probes is 10 ms), so
nothing waits for the bound and the machine's speed changes no verdict."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from hybridflow.coordinator.config import CoordinatorConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.services.rollout.client import GrpcRolloutClient
from tests.fault.test_replica_stall import STALL_S, FakeClock, TargetedLearner, _audit
from tests.helpers import start_rollout_server
from tests.unit.coordinator.fakes import FakeReward, FakeRollout, records

STEP = STALL_S / 4  # probe_timing's interval for the bound


class ClockedClient:
    """The wedged replica's client: every probe from its dispatcher (``dispatch-1``) comes
    one probe interval after the last on the fake clock; what each probe read is kept."""

    def __init__(self, inner: GrpcRolloutClient, clock: FakeClock) -> None:
        self.inner, self.clock = inner, clock
        self.readings: list[tuple[float, int, int]] = []  # (clock, engine_steps, active)
        self.version = 0  # the fake learner sets it on publish (the real weights: not needed)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.generate(*args, **kwargs)

    def status(self, timeout_s: float | None = None) -> Any:
        probing = threading.current_thread().name == "dispatch-1"
        if probing:
            self.clock.advance(STEP)
        status = self.inner.status(timeout_s)
        if probing:
            self.readings.append((self.clock(), status.engine_steps, status.num_active_requests))
        return status


def test_wedged_engine_whose_server_answers_leaves_dispatch_and_the_job_completes(
    tiny_model_path: Path, tmp_path: Path, caplog: Any
) -> None:
    server, rollout = start_rollout_server(tiny_model_path)
    model = rollout.engine.model  # type: ignore[attr-defined]
    forward, release, wedged = model.forward, threading.Event(), threading.Event()

    def wedged_forward(*args: Any, **kwargs: Any) -> Any:
        wedged.set()
        release.wait()  # the engine thread blocks; the gRPC server keeps answering
        return forward(*args, **kwargs)

    model.forward = wedged_forward
    clock = FakeClock()
    client = ClockedClient(GrpcRolloutClient(server.address), clock)
    try:
        healthy = FakeRollout()
        names = ["127.0.0.1:1001", server.address]
        learner = TargetedLearner([healthy, client], names)
        services = Services(
            [healthy, client],  # type: ignore[list-item]
            FakeReward(),
            learner,
            names,
            lambda ids: str(ids[-1]),
        )
        config = CoordinatorConfig(
            num_steps=8,
            prompts_per_step=4,
            prompts_per_request=2,
            group_size=2,
            progress=False,
            replica_stall_timeout_s=STALL_S,
            replica_rejoin_timeout_s=0,
        )
        job = TrainingJob(config, services, records(64), tmp_path)
        for d in job.dispatchers:
            d.clock = clock
            d.probe_interval_s = 0.01  # real seconds between probes; silence is on the fake clock
        with caplog.at_level(logging.WARNING):
            summary = job.run()
        stalled = job.dispatchers[1]
        assert wedged.is_set() and server.address in names
        assert summary.num_steps == 8
        assert stalled.failed and stalled.num_stalled == 1
        assert summary.num_requeued == 2  # the wedged request's prompts, trained elsewhere
        seqs = _audit(tmp_path)
        assert len(seqs) == 8 * 4 and set(seqs.values()) == {1}  # exactly once
        # Every probe was answered; the last ones held the request with the count still.
        readings = client.readings
        assert readings, "the wedged replica was never probed"
        detected, stuck_at, active = readings[-1]
        assert active == 1 and stuck_at > 0
        stuck = [t for t, steps, n in readings if (steps, n) == (stuck_at, 1)]
        # Out one bound after its last sign of life: the reading where the count last
        # moved (or, if the request's first reading already was stuck, the request's start,
        # one interval before it). No reading decides before the bound, none past it.
        assert STALL_S - STEP <= detected - stuck[0] <= STALL_S
        line = next(r.getMessage() for r in caplog.records if "made no progress" in r.getMessage())
        assert f"replica 1 ({server.address})" in line and "engine_steps stuck at" in line
    finally:
        release.set()  # the abandoned request ends; its reply is dropped
        client.inner.close()
        server.server.stop(grace=None)
