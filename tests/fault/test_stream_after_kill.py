"""A streaming call whose server is SIGKILLed before it answers fails at once with
UNAVAILABLE instead of hanging until its deadline (with gRPC's retry policy on streams it
hung: a rollout replica killed mid-Generate stalled the whole job)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc

SERVER = r"""
import sys, threading, time
from concurrent import futures
from pathlib import Path
import grpc
from hybridflow.v1 import rollout_pb2_grpc

class Stuck(rollout_pb2_grpc.RolloutServiceServicer):
    def Generate(self, request, context):
        Path(sys.argv[1] + ".got").write_text("1")
        threading.Event().wait()  # never answers
        yield from ()

server = grpc.server(futures.ThreadPoolExecutor(2))
rollout_pb2_grpc.add_RolloutServiceServicer_to_server(Stuck(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
Path(sys.argv[1]).write_text(f"127.0.0.1:{port}")
server.wait_for_termination()
"""


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    done = threading.Event()

    def poll() -> None:
        while not path.exists() and proc.poll() is None:
            done.wait(0.05)
        done.set()

    threading.Thread(target=poll, daemon=True).start()
    assert done.wait(timeout_s) and path.exists(), f"{path} never appeared"


def test_generate_to_a_killed_server_fails_fast(tmp_path: Path) -> None:
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.services.rollout.client import GrpcRolloutClient
    from hybridflow.types import SamplingParams

    addr_file = tmp_path / "addr"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(addr_file)])
    try:
        _wait_for(addr_file, proc)
        client = GrpcRolloutClient(addr_file.read_text(), ChannelConfig(timeout_s=600))
        outcome: dict[str, object] = {}

        def call() -> None:
            try:
                client.generate([[5, 6]], SamplingParams(max_new_tokens=2, n=1))
            except grpc.RpcError as exc:
                outcome["code"] = exc.code()

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        _wait_for(Path(f"{addr_file}.got"), proc)  # the request reached the server
        os.kill(proc.pid, signal.SIGKILL)
        thread.join(60)  # far below the 600 s deadline: a hang would wait for that
        assert not thread.is_alive(), "the call hung after its server died"
        assert outcome["code"] == grpc.StatusCode.UNAVAILABLE
        client.close()
    finally:
        proc.kill()
        proc.wait()
