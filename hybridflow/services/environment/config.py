"""Configuration of the environment service, the ``environment:`` section of the job config
(imports without torch or grpc).

This module only describes and validates settings; it never imports an environment class
(the service does, when an episode of an allow-listed class is reset).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems
from hybridflow.envs.python_tool import ENV_PATH as PYTHON_TOOL_ENV
from hybridflow.rpc.config import ServerConfig
from hybridflow.sandbox.config import SandboxConfig


@dataclass
class AgentEndpointConfig:
    """The OpenAI-compatible HTTP endpoint of agent episodes (each its own base URL and key),
    served by the environment service when the job has an agent
    (``coordinator.multi_turn.agent``)."""

    host: str = knob("127.0.0.1", free="an interface address (loopback by default)")
    """Interface the endpoint listens on; agents run in this service, so loopback serves
    them."""
    port: int = knob(0, ge=0, le=65535)
    """Port (0: the OS picks)."""
    max_requests: int = knob(64, ge=1)
    """Chat requests one episode may make; one more ends the episode with an error."""
    max_response_tokens: int = knob(4096, ge=1)
    """Tokens after the prompts (generated and the template's for the agent's messages) of
    one episode over all its segments."""
    max_body_kb: int = knob(4096, ge=1)
    """Largest request body (KiB)."""
    max_request_chars: int = knob(256 * 1024, ge=1)
    """Characters of one request's messages and tools together."""
    batch_window_ms: float = knob(10.0, ge=0, le=1000)
    """How long the first of the episodes' requests to one replica waits for others before
    they are sent as one Generate (agents ask one completion at a time, many at once)."""
    on_break: Literal["split", "refuse"] = "split"
    """A request that does not extend its episode's context (edited history, a template that
    drops reasoning): split (a new segment, trained on its own) or refuse (the episode ends
    with an error); docs/agents.md."""

    def validate(self) -> None:
        raise_problems(list(field_problems(self, "environment.endpoint")))


@dataclass
class EnvironmentConfig:
    """Which environment classes the service may run, and its bounds."""

    envs: list[str] = knob(
        default_factory=list, free="import paths, loaded when an episode is reset (validate)"
    )
    """The environment classes the service may instantiate ("package.module:Class" or
    "path/to/file.py:Class"); a Reset naming any other path is refused, so a call never
    imports code the job did not list. Empty: deploy/launch.sh starts no environment
    service."""
    max_episodes: int = knob(1024, ge=1)
    """Most episodes live at once; a call that outlived step_timeout_s holds its episode's
    place until its thread returns. A Reset beyond it is refused."""
    max_action_chars: int = knob(64 * 1024, ge=1)
    """Longest policy turn (characters) a Step may carry; a longer one is refused before the
    environment sees it."""
    max_message_chars: int = knob(64 * 1024, ge=1)
    """Longest text of any one message: each text field of a Reset's task is refused above
    it, and an environment that answers a longer message ends that episode with an error."""
    step_timeout_s: float = knob(60.0, gt=0)
    """Seconds an environment's reset or step may run (in a thread of the service); one that
    takes longer ends that episode with an error while its thread runs on. Keep it below
    the client's deadline (coordinator.channel.timeout_s)."""
    agent_timeout_s: float = knob(600.0, gt=0)
    """Seconds an agent episode (``RunAgent``: the agent's whole loop) may run; past it the
    episode ends with an error and its endpoint refuses further requests. Keep it below the
    client's deadline (coordinator.channel.timeout_s)."""
    endpoint: AgentEndpointConfig = field(default_factory=AgentEndpointConfig)
    """The OpenAI-compatible endpoint agent episodes talk to (``hybridflow/agents/``)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The sandbox pool environments run programs in (the ``python`` tool of
    ``hybridflow.envs.python_tool``), made on first use; keep wall_s below step_timeout_s."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits of the environment service."""

    @property
    def enabled(self) -> bool:
        """Whether the job runs an environment service (``envs`` lists a class)."""
        return bool(self.envs)

    def validate(self) -> None:
        """Raise ValueError naming every bad field: each field's bound, plus each ``envs``
        entry a ``module:Class`` path, listed once."""
        found = list(field_problems(self, "environment"))
        seen: set[str] = set()
        for i, path in enumerate(self.envs):
            if not isinstance(path, str) or ":" not in path or path.startswith(":"):
                found.append(
                    f"environment.envs[{i}]: expected 'package.module:Class' or "
                    f"'path/to/file.py:Class', got {path!r}"
                )
            elif path in seen:
                found.append(f"environment.envs[{i}]: {path!r} is listed twice")
            seen.add(str(path))
        if PYTHON_TOOL_ENV in self.envs and self.sandbox.wall_s >= self.step_timeout_s:
            found.append(
                f"environment.sandbox.wall_s ({self.sandbox.wall_s:g}) must be below "
                f"environment.step_timeout_s ({self.step_timeout_s:g}): a tool call that runs to "
                "its limit would end its episode as hung"
            )
        raise_problems(found)
        self.server.validate()
        self.sandbox.validate("environment.sandbox")
        self.endpoint.validate()
