"""Environment service process: ``python -m hybridflow.services.environment --config job.yaml``."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from hybridflow.utils.startup_marks import mark, mark_process_start

    mark_process_start("environment")
    from hybridflow.services.bootstrap import service_arg_parser, setup_logging, watch_parent

    parser = service_arg_parser(
        "hybridflow-environment", "Serve multi-turn environments over gRPC."
    )
    args = parser.parse_args(argv)
    watch_parent()
    log = setup_logging("environment")

    from hybridflow.job_config import load_job_config
    from hybridflow.rpc.server import serve_until_signal, start_server, write_port_file
    from hybridflow.services.environment.episodes import EpisodeHost
    from hybridflow.services.environment.servicer import SERVICE_NAME, EnvironmentServicer
    from hybridflow.v1 import environment_pb2_grpc

    job = load_job_config(args.config, args.set)
    mark("environment", "imported")  # and the config loaded
    cfg = job.environment
    host = EpisodeHost(cfg, cfg.server.concurrency_limit)
    servicer = EnvironmentServicer(host)
    running = start_server(
        cfg.server,
        lambda s: environment_pb2_grpc.add_EnvironmentServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    if args.port_file:
        write_port_file(args.port_file, running.address)
    mark("environment", "serving")
    log.info(
        "environment service ready on %s (envs: %s; max_episodes %d)",
        running.address,
        cfg.envs or "none",
        cfg.max_episodes,
    )
    serve_until_signal(running, cfg.server.grace_s, on_stop=host.shutdown)
    return 0


if __name__ == "__main__":
    from hybridflow.utils.fast_exit import exit_service

    exit_service(main())
