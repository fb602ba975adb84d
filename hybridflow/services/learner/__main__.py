"""Learner process: ``python -m hybridflow.services.learner --config job.yaml``, or under
``torchrun --nproc-per-node N -m hybridflow.services.learner`` for FSDP2 over N ranks (with
``learner.topology.critic_nproc_per_node`` C > 0, N = nproc_per_node + C and the last C ranks hold only
the critic). Rank 0 (an actor rank) serves gRPC and relays every command to the other ranks.
"""

from __future__ import annotations

import sys
from dataclasses import replace


def main(argv: list[str] | None = None) -> int:
    from hybridflow.services.bootstrap import (
        service_arg_parser,
        set_torch_threads,
        setup_logging,
        watch_parent,
    )

    parser = service_arg_parser("hybridflow-learner", "Serve the learner (rank 0) over gRPC.")
    args = parser.parse_args(argv)
    watch_parent()

    from hybridflow.job_config import load_job_config

    job = load_job_config(args.config, args.set)
    cfg = job.learner
    set_torch_threads(cfg.topology.num_threads)

    from hybridflow.services.learner.distributed import CommandRelay, control_group, init_from_env

    dist_info = init_from_env(cfg.topology.device)
    log = setup_logging(f"learner{dist_info.rank}")

    from hybridflow.models import resolve_model_path
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.weights.client import GrpcWeightSyncClient

    try:
        path = resolve_model_path(job.model)
        worker = LearnerWorker(cfg, path)
    except ValueError as exc:
        log.error("cannot load the model: %s", exc)
        return 2
    # The replicas' weight-sync services are called with the job's client settings (TLS
    # across hosts), with the learner's message limit.
    channel = replace(job.coordinator.channel, max_message_bytes=cfg.server.max_message_bytes)
    core = LearnerCore(
        worker,
        dist_info.rank,
        job.weight_sync,
        lambda address: GrpcWeightSyncClient(address, channel),
    )
    relay = CommandRelay(core.dispatch, group=control_group() if dist_info.is_distributed else None)
    if dist_info.rank != 0:
        import signal

        # torchrun forwards SIGTERM to every rank at once; the others must outlive rank 0's
        # drain and leave on its relayed "shutdown", or rank 0's last broadcast fails.
        signal.signal(signal.SIGTERM, lambda *_: log.info("SIGTERM: waiting for rank 0"))
        log.info("rank %d serving relayed commands", dist_info.rank)
        relay.serve()
        return 0

    from hybridflow.rpc.server import serve_until_signal, start_server, write_port_file
    from hybridflow.services.learner.servicer import SERVICE_NAME, LearnerServicer
    from hybridflow.v1 import learner_pb2, learner_pb2_grpc

    def info() -> learner_pb2.LearnerInfo:
        return learner_pb2.LearnerInfo(
            model=job.model,
            algorithm=cfg.algorithm,
            policy_version=worker.policy_version,
            world_size=dist_info.world_size,
            needs_greedy_baseline=core.needs_greedy_baseline(),
            needs_routed_experts=core.needs_routed_experts(),
            versions_per_step=worker.versions_per_step(),
        )

    servicer = LearnerServicer(
        dispatch=relay.call,
        info=info,
        vocab_size=worker.vocab_size,
        max_bytes=cfg.server.max_message_bytes,
        chunk_bytes=channel.chunk_bytes,
        checkpoint_root=cfg.checkpoint_dir,
        weight_sync=job.weight_sync,
        channel=channel,
    )
    running = start_server(
        cfg.server,
        lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    if running.metrics is not None:
        running.metrics.gauge(
            "hybridflow_policy_version", "Policy version trained", lambda: worker.policy_version
        )
        running.metrics.gauge(
            "hybridflow_weight_sync_last_seconds",
            "Seconds of the last weight publish to the rollout replicas",
            lambda: servicer.last_publish_s,
        )
    if args.port_file:
        write_port_file(args.port_file, running.address)
    log.info(
        "learner ready on %s (world %d, %d of them critic ranks, %s)",
        running.address,
        dist_info.world_size,
        cfg.topology.critic_nproc_per_node,
        cfg.algorithm,
    )
    serve_until_signal(running, cfg.server.grace_s, on_stop=relay.shutdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
