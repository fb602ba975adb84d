"""Off loopback a service needs TLS and a token (or an explicit opt-out); loopback needs
neither. Checked before anything listens (start_server) and before anything starts
(preflight)."""

import pytest

from hybridflow.deploy.preflight import check_job
from hybridflow.job_config import load_job_config
from hybridflow.rpc.config import ServerConfig, is_loopback_host, remote_exposure_problem
from hybridflow.rpc.server import start_server


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.0.3", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("10.0.0.5", False), ("::", False),
     ("node1", False)],
)  # fmt: skip
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback


def test_off_loopback_needs_tls_and_a_token():
    remote = ServerConfig(host="0.0.0.0")
    assert remote_exposure_problem(ServerConfig(), token="") is None
    assert remote_exposure_problem(remote, token="") == (
        "server.host=0.0.0.0 listens off loopback without TLS (server.tls_cert and "
        "server.tls_key) and a token ($HYBRIDFLOW_TOKEN or server.auth_token_file): set them "
        "(or server.allow_insecure_remote: true on a network you trust completely)"
    )
    assert "without a token" in remote_exposure_problem(
        ServerConfig(host="0.0.0.0", tls_cert="c.pem", tls_key="k.pem"), token=""
    )
    assert (
        remote_exposure_problem(
            ServerConfig(host="0.0.0.0", tls_cert="c.pem", tls_key="k.pem"), token="t"
        )
        is None
    )
    assert (
        remote_exposure_problem(ServerConfig(host="0.0.0.0", allow_insecure_remote=True), token="")
        is None
    )


def test_start_server_refuses_before_listening(monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"server.host=0.0.0.0 listens off loopback"):
        start_server(ServerConfig(host="0.0.0.0"), lambda server: None, [])


def test_preflight_names_the_service_off_loopback():
    job = load_job_config(None, ["reward.server.host=0.0.0.0"])
    lines = [p for p in check_job(job, ports=[]) if "off loopback" in p]
    assert lines == [
        "config error: reward.server.host=0.0.0.0 listens off loopback without TLS "
        "(reward.server.tls_cert and reward.server.tls_key): set them (or "
        "reward.server.allow_insecure_remote: true on a network you trust completely)"
    ]


def test_the_advertised_address_is_one_other_hosts_can_reach():
    import socket

    assert ServerConfig().reachable_host == "127.0.0.1"
    assert ServerConfig(host="10.0.0.5").reachable_host == "10.0.0.5"
    assert ServerConfig(host="0.0.0.0").reachable_host == socket.gethostname()
    assert ServerConfig(host="0.0.0.0", advertise_host="node7.cluster").reachable_host == (
        "node7.cluster"
    )
