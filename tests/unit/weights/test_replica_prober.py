"""The learner's liveness probe before a publish keeps one channel per replica: a probe is a
round trip, not a connection; a failed probe drops its channel and names the replica; the
replica back on its address answers the next probe."""

from __future__ import annotations

import pytest

from hybridflow.errors import Unavailable
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.v1 import weight_sync_pb2, weight_sync_pb2_grpc
from hybridflow.weights import client
from hybridflow.weights.client import ReplicaProber


class Describes(weight_sync_pb2_grpc.WeightSyncServiceServicer):
    def __init__(self) -> None:
        self.calls = 0

    def Describe(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self.calls += 1
        return weight_sync_pb2.WeightSyncInfo()


def _serve(port: int = 0):  # type: ignore[no-untyped-def]
    servicer = Describes()
    running = start_server(
        ServerConfig(port=port),
        lambda s: weight_sync_pb2_grpc.add_WeightSyncServiceServicer_to_server(servicer, s),
        ["hybridflow.v1.WeightSyncService"],
    )
    return running, servicer


def test_probes_reuse_one_channel_and_a_failure_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    real = client.make_channel
    monkeypatch.setattr(client, "make_channel", lambda *a: made.append(a) or real(*a))
    running, servicer = _serve()
    prober = ReplicaProber()
    try:
        for _ in range(3):
            prober(running.address, None, 5.0)
        assert servicer.calls == 3 and len(made) == 1

        running.server.stop(None).wait()
        with pytest.raises(Unavailable, match=f"replica {running.address} did not answer"):
            prober(running.address, None, 1.0)
        assert len(made) == 1

        back, again = _serve(running.port)  # restarted on its address
        try:
            prober(running.address, None, 5.0)
            assert again.calls == 1 and len(made) == 2  # a fresh channel after the failure
        finally:
            back.server.stop(None)
    finally:
        prober.close()
        running.server.stop(None)
