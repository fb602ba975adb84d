"""Environment service process: ``python -m hybridflow.main.environment --config job.yaml``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None = None) -> int:
    from hybridflow.utils.startup_marks import mark, mark_process_start

    mark_process_start("environment")
    from hybridflow.main.bootstrap import (
        serve,
        service_arg_parser,
        setup_logging,
        watch_parent,
    )

    parser = service_arg_parser(
        "hybridflow-environment", "Serve multi-turn environments over gRPC."
    )
    args = parser.parse_args(argv)
    watch_parent()
    log = setup_logging("environment")

    from hybridflow.job_config import load_job_config
    from hybridflow.services.environment.episodes import EpisodeHost
    from hybridflow.services.environment.servicer import SERVICE_NAME, EnvironmentServicer

    job = load_job_config(args.config, args.set)
    mark("environment", "imported")  # and the config loaded
    cfg = job.environment
    from hybridflow.sandbox import shared as shared_sandbox

    shared_sandbox.configure(cfg.sandbox)  # the python tool's pool, made on its first call
    host = EpisodeHost(cfg, cfg.server.concurrency_limit)
    agents = _agent_host(job) if job.coordinator.multi_turn.agent else None
    servicer = EnvironmentServicer(host, agents)
    serve(
        "environment",
        cfg.server,
        servicer.add_to_server,
        [SERVICE_NAME],
        port_file=args.port_file,
        log=log,
        ready=lambda address: (
            f"environment service ready on {address} "
            f"(envs: {cfg.envs or 'none'}; max_episodes {cfg.max_episodes}"
            + (f"; agent endpoint {agents.endpoint.address})" if agents else ")")
        ),
        on_stop=lambda: _stop(
            host.shutdown,
            shared_sandbox.close,
            *((agents.shutdown, agents.endpoint.stop) if agents else ()),
        ),
    )
    return 0


def _agent_host(job: Any) -> Any:
    """The agent episodes' host: the OpenAI-compatible endpoint (the job model's tokenizer,
    serving on ``environment.endpoint``) and a gRPC client per replica, made on first use."""
    import threading

    from hybridflow.agents.capture import CaptureLimits
    from hybridflow.agents.endpoint import AgentEndpoint, EndpointLimits
    from hybridflow.agents.openai_wire import Bounds
    from hybridflow.models import resolve_model_path
    from hybridflow.models.text_only import load_tokenizer
    from hybridflow.services.environment.agent_episodes import AgentHost
    from hybridflow.services.rollout.client import GrpcRolloutClient

    cfg, endpoint_cfg = job.environment, job.environment.endpoint
    limits = EndpointLimits(
        max_episodes=cfg.max_episodes,
        max_body_bytes=endpoint_cfg.max_body_kb * 1024,
        episode_wall_s=cfg.agent_timeout_s,
        capture=CaptureLimits(endpoint_cfg.max_requests, endpoint_cfg.max_response_tokens),
        wire=Bounds(
            max_chars=endpoint_cfg.max_request_chars,
            max_tokens=job.coordinator.sampling.max_new_tokens,
        ),
        on_break=endpoint_cfg.on_break,
    )
    tokenizer = load_tokenizer(resolve_model_path(job.model))
    endpoint = AgentEndpoint(tokenizer, job.model, limits, endpoint_cfg.host, endpoint_cfg.port)
    endpoint.start()
    clients: dict[str, GrpcRolloutClient] = {}
    lock = threading.Lock()

    def rollout_for(address: str) -> GrpcRolloutClient:
        with lock:
            if address not in clients:
                clients[address] = GrpcRolloutClient(address, job.coordinator.channel)
            return clients[address]

    return AgentHost(cfg, endpoint, rollout_for)


def _stop(*closers: Callable[[], None]) -> None:
    for close in closers:
        close()


if __name__ == "__main__":
    from hybridflow.utils.fast_exit import exit_service

    exit_service(main())
