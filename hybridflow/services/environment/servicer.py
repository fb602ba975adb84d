"""gRPC face of the environment service: proto → domain → EpisodeHost → proto.

Each call is bounded before any work: a non-empty ``episode_id``, the action within
``environment.max_action_chars`` and each text of a task within
``environment.max_message_chars`` (else INVALID_ARGUMENT naming the key). An episode's own
failure (its environment raised or hung, or it is not live) is an OK answer with ``error``
set, never an RPC failure, so one episode never fails the caller's others."""

from __future__ import annotations

import json
import secrets

import grpc

from hybridflow.envs.runner import EpisodeError
from hybridflow.rpc.codec import sampling_from_proto
from hybridflow.rpc.errors import handle_errors
from hybridflow.services.environment import convert
from hybridflow.services.environment.agent_episodes import AgentHost
from hybridflow.services.environment.episodes import EpisodeHost
from hybridflow.v1 import common_pb2, environment_pb2, environment_pb2_grpc

SERVICE_NAME = environment_pb2.DESCRIPTOR.services_by_name["EnvironmentService"].full_name

_TASK_FIELDS = ("prompt", "ground_truth", "data_source", "extra_info_json")


def check_episode_id(episode_id: str) -> None:
    if not episode_id:
        raise ValueError("episode_id: must be non-empty")


def check_task_limits(task: environment_pb2.EpisodeTask, max_chars: int) -> None:
    """ValueError naming the task field over environment.max_message_chars."""
    for name in _TASK_FIELDS:
        size = len(getattr(task, name))
        if size > max_chars:
            raise ValueError(
                f"task.{name} has {size} characters, more than "
                f"environment.max_message_chars={max_chars}"
            )


class EnvironmentServicer(environment_pb2_grpc.EnvironmentServiceServicer):
    """The environment service over gRPC. ``instance`` (random per servicer, so per process)
    is in every answer: a client that sees it change knows the episodes it started are gone."""

    def __init__(self, host: EpisodeHost, agents: AgentHost | None = None) -> None:
        """``agents``: the agent episodes' host (None: the job has no agent)."""
        self._host = host
        self._agents = agents
        self.instance = secrets.token_hex(8)

    def add_to_server(self, server: grpc.Server) -> None:
        """Registers this servicer on ``server`` (the process's main, without the
        generated code)."""
        environment_pb2_grpc.add_EnvironmentServiceServicer_to_server(self, server)

    @handle_errors
    def Reset(
        self, request: environment_pb2.ResetRequest, context: grpc.ServicerContext
    ) -> environment_pb2.ResetResponse:
        check_episode_id(request.episode_id)
        check_task_limits(request.task, self._host.config.max_message_chars)
        task = convert.task_from_proto(request.task)
        try:
            opening = self._host.reset(request.episode_id, request.env, task)
        except EpisodeError as exc:
            return environment_pb2.ResetResponse(error=str(exc), instance=self.instance)
        return environment_pb2.ResetResponse(
            messages=convert.messages_to_proto(opening), instance=self.instance
        )

    @handle_errors
    def Step(
        self, request: environment_pb2.StepRequest, context: grpc.ServicerContext
    ) -> environment_pb2.StepResponse:
        check_episode_id(request.episode_id)
        bound = self._host.config.max_action_chars
        if len(request.action) > bound:
            raise ValueError(
                f"action has {len(request.action)} characters, more than "
                f"environment.max_action_chars={bound}"
            )
        try:
            result = self._host.step(request.episode_id, request.action)
        except EpisodeError as exc:
            return environment_pb2.StepResponse(error=str(exc), instance=self.instance)
        return convert.step_to_proto(result, self.instance)

    @handle_errors
    def RunAgent(
        self, request: environment_pb2.RunAgentRequest, context: grpc.ServicerContext
    ) -> environment_pb2.RunAgentResponse:
        check_episode_id(request.episode_id)
        check_task_limits(request.task, self._host.config.max_message_chars)
        if self._agents is None:
            raise ValueError(
                "this environment service runs no agents: set coordinator.multi_turn.agent "
                "(and list it in environment.envs)"
            )
        if not request.replica_address:
            raise ValueError("replica_address: must be non-empty")
        run = self._agents.run(
            request.episode_id,
            request.agent,
            convert.task_from_proto(request.task),
            request.replica_address,
            sampling_from_proto(request.sampling),
        )
        captured = run.captured
        return environment_pb2.RunAgentResponse(
            reward=run.reward,
            info_json=json.dumps(run.info) if run.info else "",
            trajectories=[convert.trajectory_to_proto(t) for t in captured.trajectories]
            if captured
            else [],
            num_requests=captured.num_requests if captured else 0,
            breaks=captured.breaks if captured else {},
            error=run.error,
            replica_error=run.replica_error,
            instance=self.instance,
        )

    @handle_errors
    def Close(
        self, request: environment_pb2.CloseRequest, context: grpc.ServicerContext
    ) -> common_pb2.Empty:
        check_episode_id(request.episode_id)
        self._host.close(request.episode_id)
        return common_pb2.Empty()

    @handle_errors
    def GetInfo(
        self, request: common_pb2.Empty, context: grpc.ServicerContext
    ) -> environment_pb2.EnvironmentInfo:
        counts = self._host.counts()
        return environment_pb2.EnvironmentInfo(
            envs=list(self._host.allowed),
            num_live=counts.num_live,
            max_episodes=self._host.config.max_episodes,
            num_started=counts.num_started,
            num_finished=counts.num_finished,
            num_errored=counts.num_errored,
            num_hung=counts.num_hung,
            instance=self.instance,
        )
