"""The coordinator's control API as its command line calls it: one call (status, pause,
resume, stop or scale) to a running job, answered with its ``JobStatus``. Failed calls raise
``grpc.RpcError`` (the command line names the code and the details)."""

from __future__ import annotations

from collections.abc import Sequence

from hybridflow.coordinator.control import JobStatus
from hybridflow.coordinator.servicer import status_from_proto
from hybridflow.rpc.channel import make_channel
from hybridflow.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc


def scale_call(
    address: str, add: Sequence[str], remove: Sequence[str], timeout_s: float
) -> JobStatus:
    """Asks the coordinator at ``address`` to add the replicas at ``add`` and drain those at
    ``remove``; the status it answers with (each replica's state)."""
    channel = make_channel(address)
    try:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        request = coordinator_pb2.ScaleRequest(add=list(add), remove=list(remove))
        return status_from_proto(stub.Scale(request, timeout=timeout_s))
    finally:
        channel.close()


def control_call(address: str, command: str, timeout_s: float) -> JobStatus:
    """Runs ``command`` (``status``, ``pause``, ``resume`` or ``stop``) on the coordinator at
    ``address`` and returns the status it answers with."""
    channel = make_channel(address)
    try:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        method = {
            "status": stub.GetStatus,
            "pause": stub.Pause,
            "resume": stub.Resume,
            "stop": stub.Stop,
        }[command]
        return status_from_proto(method(common_pb2.Empty(), timeout=timeout_s))
    finally:
        channel.close()
