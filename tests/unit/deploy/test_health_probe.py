"""The exec-probe health check: exit 0 against a serving server, 1 when it is NOT_SERVING
or nothing listens."""

from __future__ import annotations

from hybridflow.deploy.health_probe import main
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server


def test_probe_follows_the_health_status():
    running = start_server(ServerConfig(allow_unauthenticated=True), lambda server: None, ["x.Svc"])
    try:
        assert main([f"--address={running.address}", "--timeout-s=5"]) == 0
        running.set_serving(False)
        assert main([f"--address={running.address}", "--timeout-s=5"]) == 1
    finally:
        running.stop(0)
    assert main([f"--address={running.address}", "--timeout-s=1"]) == 1
