"""``hybridflow-coordinator scale`` against a real control server (gRPC on loopback, the token
required): the request reaches the job's ``scale``, the answer lists each replica's state,
``--wait`` polls until the added replica serves, a refused request exits 1 with the reason
and changes nothing, and a caller without the token is refused."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.scaling import ReplicaStatus, check_scale
from hybridflow.coordinator.servicer import SERVICE_NAME, CoordinatorServicer
from hybridflow.main.coordinator import main
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server

TOKEN = "scale-cli-test-token"


class FakeJob:
    """The job's replicas: an added one joins (a drained one drains) until the first status
    read after the scale call's own answer, then serves (is removed)."""

    def __init__(self) -> None:
        self.states = {"127.0.0.1:7000": "serving"}
        self.requests: list[tuple[list[str], list[str]]] = []
        self.reads = 0

    def scale(self, add: Sequence[str], remove: Sequence[str]) -> list[ReplicaStatus]:
        check_scale(add, remove, self.states)
        self.requests.append((list(add), list(remove)))
        self.reads = 0
        self.states.update({a: "joining" for a in add})
        self.states.update({a: "draining" for a in remove})
        return self.replicas()

    def replicas(self) -> list[ReplicaStatus]:
        self.reads += 1
        if self.reads > 2:  # two reads answer the scale call itself; then they end
            self.states = {
                a: {"joining": "serving", "draining": "removed"}.get(s, s)
                for a, s in self.states.items()
            }
        return [ReplicaStatus(a, s, 3) for a, s in self.states.items()]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FakeJob]]:
    monkeypatch.setenv("HYBRIDFLOW_TOKEN", TOKEN)
    control, job = JobControl(10), FakeJob()
    control.start()
    control.attach_replicas(job.scale, job.replicas)
    servicer = CoordinatorServicer(control)
    server = start_server(ServerConfig(), servicer.add_to_server, [SERVICE_NAME])
    try:
        yield server.address, job
    finally:
        server.stop(0)


def test_scale_adds_a_replica_and_waits_until_it_serves(served, capsys) -> None:  # type: ignore[no-untyped-def]
    address, job = served
    rc = main(["scale", "--address", address, "--add", "127.0.0.1:7001", "--wait", "30"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert job.requests == [(["127.0.0.1:7001"], [])]
    assert "replica 127.0.0.1:7001  serving  v3" in out


def test_scale_drains_a_replica(served, capsys) -> None:  # type: ignore[no-untyped-def]
    address, job = served
    job.states["127.0.0.1:7001"] = "serving"
    rc = main(["scale", "--address", address, "--remove", "127.0.0.1:7000", "--json"])
    assert rc == 0
    assert job.requests == [([], ["127.0.0.1:7000"])]
    assert '"state": "draining"' in capsys.readouterr().out


def test_a_refused_request_exits_1_with_its_reason_and_changes_nothing(served, capsys) -> None:  # type: ignore[no-untyped-def]
    address, job = served
    rc = main(["scale", "--address", address, "--remove", "127.0.0.1:7000"])
    err = capsys.readouterr().err
    assert rc == 1 and "INVALID_ARGUMENT" in err and "no replica serving" in err, err
    assert job.requests == [] and job.states == {"127.0.0.1:7000": "serving"}


def test_scale_without_the_token_is_refused(served, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    address, job = served
    monkeypatch.setenv("HYBRIDFLOW_TOKEN", "not-the-token")
    rc = main(["scale", "--address", address, "--add", "127.0.0.1:7001"])
    assert rc == 1 and "UNAUTHENTICATED" in capsys.readouterr().err
    assert job.requests == []
