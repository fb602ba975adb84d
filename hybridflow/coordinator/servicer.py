"""gRPC control API of a running job: status, pause, resume, stop, scale."""

from __future__ import annotations

import grpc

from hybridflow.coordinator.control import JobControl, JobStatus
from hybridflow.coordinator.scaling import MAX_REPLICAS, ReplicaStatus
from hybridflow.rpc.errors import handle_errors
from hybridflow.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name


def status_to_proto(status: JobStatus) -> coordinator_pb2.CoordinatorStatus:
    return coordinator_pb2.CoordinatorStatus(
        state=status.state,
        step=status.step,
        total_steps=status.total_steps,
        policy_version=status.policy_version,
        last_metrics=status.last_metrics,
        run_dir=status.run_dir,
        error=status.error,
        waiting_for=status.waiting_for,
        replicas=[
            coordinator_pb2.ReplicaStatus(
                address=r.address, state=r.state, policy_version=r.policy_version
            )
            for r in status.replicas
        ],
    )


def status_from_proto(msg: coordinator_pb2.CoordinatorStatus) -> JobStatus:
    return JobStatus(
        state=msg.state,
        step=msg.step,
        total_steps=msg.total_steps,
        policy_version=msg.policy_version,
        last_metrics=dict(msg.last_metrics),
        run_dir=msg.run_dir,
        error=msg.error,
        waiting_for=msg.waiting_for,
        replicas=[ReplicaStatus(r.address, r.state, r.policy_version) for r in msg.replicas],
    )


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """The coordinator's control API over gRPC (status, pause, resume, stop, scale): a thin
    translation onto ``JobControl``; state-changing calls are authenticated by the server."""

    def __init__(self, control: JobControl) -> None:
        self._control = control

    def add_to_server(self, server: grpc.Server) -> None:
        """Registers this servicer on ``server`` (the process's main, without the
        generated code)."""
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(self, server)

    @handle_errors
    def GetStatus(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> coordinator_pb2.CoordinatorStatus:
        return status_to_proto(self._control.status())

    @handle_errors
    def Pause(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> coordinator_pb2.CoordinatorStatus:
        return status_to_proto(self._control.pause())

    @handle_errors
    def Resume(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> coordinator_pb2.CoordinatorStatus:
        return status_to_proto(self._control.resume())

    @handle_errors
    def Stop(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> coordinator_pb2.CoordinatorStatus:
        return status_to_proto(self._control.stop())

    @handle_errors
    def Scale(
        self, request: coordinator_pb2.ScaleRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.CoordinatorStatus:
        add, remove = list(request.add), list(request.remove)
        if len(add) + len(remove) > MAX_REPLICAS:
            raise ValueError(f"scale: at most {MAX_REPLICAS} addresses in one request")
        return status_to_proto(self._control.scale(add, remove))
