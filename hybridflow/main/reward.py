"""Reward service process: ``python -m hybridflow.main.reward --config job.yaml``."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from hybridflow.utils.startup_marks import mark, mark_process_start

    mark_process_start("reward")
    from hybridflow.main.bootstrap import (
        serve,
        service_arg_parser,
        setup_logging,
        setup_torch_process,
        watch_parent,
    )

    parser = service_arg_parser("hybridflow-reward", "Serve the reward scorers over gRPC.")
    args = parser.parse_args(argv)
    log = setup_logging("reward")

    from hybridflow.job_config import load_job_config

    job = load_job_config(args.config, args.set)
    cfg = job.reward
    # torch only when a reward model is configured; its allocator setting before any thread
    # starts (the lifeline's below; hybridflow.utils.malloc)
    if cfg.model_components():
        setup_torch_process(cfg.torch_threads)
    watch_parent()

    from hybridflow.services.reward.scorers import RewardScorer
    from hybridflow.services.reward.servicer import SERVICE_NAME, RewardServicer

    mark("reward", "imported")  # and the config loaded
    scorer = RewardScorer(cfg)
    servicer = RewardServicer(scorer, cfg)
    components = [f"{c.name} ({c.kind}, weight {c.weight})" for c in cfg.components]
    serve(
        "reward",
        cfg.server,
        servicer.add_to_server,
        [SERVICE_NAME],
        port_file=args.port_file,
        log=log,
        ready=lambda address: (
            f"reward service ready on {address} "
            f"(scorers: {scorer.registry.names()}; components: {components or 'none'})"
        ),
        on_stop=scorer.close,
    )
    return 0


if __name__ == "__main__":
    from hybridflow.utils.fast_exit import exit_service

    exit_service(main())
