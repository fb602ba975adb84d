"""Environment service process: ``python -m hybridflow.main.environment --config job.yaml``."""

from __future__ import annotations

from collections.abc import Callable


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
    servicer = EnvironmentServicer(host)
    serve(
        "environment",
        cfg.server,
        servicer.add_to_server,
        [SERVICE_NAME],
        port_file=args.port_file,
        log=log,
        ready=lambda address: (
            f"environment service ready on {address} "
            f"(envs: {cfg.envs or 'none'}; max_episodes {cfg.max_episodes})"
        ),
        on_stop=lambda: _stop(host.shutdown, shared_sandbox.close),
    )
    return 0


def _stop(*closers: Callable[[], None]) -> None:
    for close in closers:
        close()


if __name__ == "__main__":
    from hybridflow.utils.fast_exit import exit_service

    exit_service(main())
