"""Picks the environment client of a job: in process, or the environment service's.

``make_environment_client("")`` is ``LocalEnvironments`` (the rollout loop runs the
environments itself); with an address (``coordinator.environment_address``, which
deploy/launch.sh sets when ``environment.envs`` is non-empty) it is the gRPC client. grpc is
imported only in the second case.
"""

from __future__ import annotations

from hybridflow.envs.runner import EnvironmentClient, LocalEnvironments
from hybridflow.rpc.config import ChannelConfig


def make_environment_client(
    address: str,
    channel: ChannelConfig | None = None,
    max_episodes: int = 1024,
    agent_timeout_s: float = 600.0,
) -> EnvironmentClient:
    """``LocalEnvironments(max_episodes)`` when ``address`` is empty, else an
    ``EnvironmentServiceClient`` of ``address`` over ``channel`` (the service has its own
    bound, ``environment.max_episodes``; ``agent_timeout_s``: its
    ``environment.agent_timeout_s``, from which agent episodes' deadlines are set)."""
    if not address:
        return LocalEnvironments(max_episodes)
    from hybridflow.services.environment.client import EnvironmentServiceClient

    return EnvironmentServiceClient(address, channel, agent_timeout_s)
