"""The environment service's gRPC client: an ``EnvironmentClient`` (``hybridflow.envs.runner``)
whose twin is ``LocalEnvironments``.

Every call has the deadline ``ChannelConfig.timeout_s`` (keep it above the service's
``environment.step_timeout_s``, so a hung environment is answered as that episode's error
before the call gives up). An episode's failure is ``EpisodeError``; refused input is
``BadRequest`` (a ValueError, as in process); a service that is unreachable, past the
deadline, or restarted since it reset the episode is ``EnvironmentUnavailable``: the rollout
loop closes those episodes (best effort: a call past its deadline may have left one live
there) and restarts them from their task under new episode ids.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from hybridflow.agents.runner import AgentEpisode
from hybridflow.envs.base import Message, StepResult, Task
from hybridflow.envs.runner import EnvironmentUnavailable, EpisodeError
from hybridflow.errors import Unavailable
from hybridflow.rpc.channel import make_channel
from hybridflow.rpc.client_errors import translate_errors
from hybridflow.rpc.codec import sampling_to_proto
from hybridflow.rpc.config import ChannelConfig
from hybridflow.services.environment import convert
from hybridflow.types import SamplingParams
from hybridflow.v1 import common_pb2, environment_pb2, environment_pb2_grpc

F = TypeVar("F", bound=Callable[..., Any])
AGENT_CALL_MARGIN_S = 30.0
"""A RunAgent call's deadline past the service's agent_timeout_s (its answer after a hung
agent is given up, and the transfer)."""


def _unavailable_as_environment(method: F) -> F:
    """Re-raises ``Unavailable`` (UNAVAILABLE, DEADLINE_EXCEEDED) as EnvironmentUnavailable.
    The episode's record stays until it is closed: a retry after the service came back is
    still told apart from the episode's own error."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except EnvironmentUnavailable:
            raise
        except Unavailable as exc:
            raise EnvironmentUnavailable(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


class EnvironmentServiceClient:
    """The environment service as the rollout loop calls it. Thread-safe: threads may drive
    different episodes at once. Remembers, per episode it reset, the service instance that
    holds it, to tell a restarted service (its episodes lost) from an episode's own error."""

    service = "environment"
    """Names the service in failed calls' messages."""

    def __init__(
        self, address: str, config: ChannelConfig | None = None, agent_timeout_s: float = 600.0
    ) -> None:
        """``agent_timeout_s``: the service's ``environment.agent_timeout_s`` (a RunAgent
        call waits that long and a margin)."""
        self.address = address
        self.agent_timeout_s = agent_timeout_s
        self._config = config or ChannelConfig()
        self._channel = make_channel(address, self._config)
        self._stub = environment_pb2_grpc.EnvironmentServiceStub(self._channel)
        self._lock = threading.Lock()
        self._instances: dict[str, str] = {}
        """Episode id → the instance that answered its Reset (dropped when it ends)."""

    @_unavailable_as_environment
    @translate_errors
    def reset(self, episode_id: str, env: str, task: Task) -> tuple[Message, ...]:
        request = environment_pb2.ResetRequest(
            episode_id=episode_id, env=env, task=convert.task_to_proto(task)
        )
        reply = self._stub.Reset(request, timeout=self._config.timeout_s)
        if reply.error:
            raise EpisodeError(reply.error)
        with self._lock:
            self._instances[episode_id] = reply.instance
        return convert.messages_from_proto(reply.messages)

    @_unavailable_as_environment
    @translate_errors
    def step(self, episode_id: str, action: str) -> StepResult:
        request = environment_pb2.StepRequest(episode_id=episode_id, action=action)
        reply = self._stub.Step(request, timeout=self._config.timeout_s)
        with self._lock:
            expected = self._instances.get(episode_id)
        if expected is not None and reply.instance != expected:
            self._forget(episode_id)
            raise EnvironmentUnavailable(
                f"environment at {self.address} restarted since episode {episode_id!r} was "
                "reset: the episode is lost"
            )
        if reply.error:
            self._forget(episode_id)
            raise EpisodeError(reply.error)
        result = convert.step_from_proto(reply)
        if result.done:
            self._forget(episode_id)
        return result

    @_unavailable_as_environment
    @translate_errors
    def run_agent(
        self,
        episode_id: str,
        agent: str,
        task: Task,
        replica_address: str,
        params: SamplingParams,
    ) -> AgentEpisode:
        """One agent episode whole (``RunAgent``), with the deadline the service's
        ``agent_timeout_s`` plus ``AGENT_CALL_MARGIN_S``."""
        request = environment_pb2.RunAgentRequest(
            episode_id=episode_id,
            agent=agent,
            task=convert.task_to_proto(task),
            replica_address=replica_address,
            sampling=sampling_to_proto(params),
        )
        reply = self._stub.RunAgent(request, timeout=self.agent_timeout_s + AGENT_CALL_MARGIN_S)
        return AgentEpisode(
            reward=reply.reward,
            info=convert.json_object(reply.info_json, "info_json"),
            trajectories=[
                convert.trajectory_from_proto(t, f"trajectories[{i}]")
                for i, t in enumerate(reply.trajectories)
            ],
            num_requests=reply.num_requests,
            breaks=dict(reply.breaks),
            error=reply.error,
            replica_error=reply.replica_error,
        )

    @_unavailable_as_environment
    @translate_errors
    def close(self, episode_id: str) -> None:
        self._forget(episode_id)
        self._stub.Close(
            environment_pb2.CloseRequest(episode_id=episode_id), timeout=self._config.timeout_s
        )

    @translate_errors
    def info(self) -> environment_pb2.EnvironmentInfo:
        """The service's allow-list, bounds and counters (GetInfo)."""
        return self._stub.GetInfo(common_pb2.Empty(), timeout=self._config.timeout_s)

    def shutdown(self) -> None:
        """Closes the channel (``close`` is the episode's)."""
        self._channel.close()

    def _forget(self, episode_id: str) -> None:
        with self._lock:
            self._instances.pop(episode_id, None)
