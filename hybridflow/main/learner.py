"""Learner process: ``python -m hybridflow.main.learner --config job.yaml``, or under
``torchrun --nproc-per-node N -m hybridflow.main.learner`` for FSDP2 over N ranks (with
``learner.topology.critic_nproc_per_node`` C > 0, N = nproc_per_node + C and the last C ranks hold only
the critic). Rank 0 (an actor rank) serves gRPC and relays every command to the other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    import logging

    from hybridflow.job_config import JobConfig
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.rpc.server import RunningServer
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.distributed import CommandRelay, DistInfo
    from hybridflow.services.learner.worker import LearnerWorker


@dataclass
class _Learner:
    """This rank's learner, built before it serves: the job config, its place in the group,
    its log, the model (``worker``), the ``core`` that runs each command and publishes
    weights, the ``relay`` that runs each command on every rank, and the client settings
    for the replicas' weight-sync services (``channel``)."""

    job: JobConfig
    dist_info: DistInfo
    log: logging.Logger
    worker: LearnerWorker
    core: LearnerCore
    relay: CommandRelay
    channel: ChannelConfig


def main(argv: list[str] | None = None) -> int:
    """The learner on every rank: its config and place in the group, then the model; rank 0
    serves gRPC until a signal, the other ranks serve the commands it relays. Exit 2 when
    the model does not load, else 0 once stopped."""
    from hybridflow.utils.startup_gc import resume_collection

    try:
        args, job, dist_info, log = _setup(argv)
        learner = _build(job, dist_info, log)
    finally:
        resume_collection()  # _build resumes it after the imports; this, on any failure
    if learner is None:
        return 2
    if dist_info.rank != 0:
        _serve_relayed(learner)
        return 0
    _serve(learner, args.port_file)
    return 0


def _setup(
    argv: list[str] | None,
) -> tuple[argparse.Namespace, JobConfig, DistInfo, logging.Logger]:
    """The command line (ends with the parent: ``watch_parent``), the job config, torch's
    threads, this process's place in the torchrun group (none for a plain start) and its
    log, named by rank."""
    from hybridflow.main.bootstrap import (
        service_arg_parser,
        setup_logging,
        setup_torch_process,
        watch_parent,
    )
    from hybridflow.utils.malloc import keep_freed_memory
    from hybridflow.utils.startup_gc import pause_collection
    from hybridflow.utils.startup_marks import mark, mark_process_start

    keep_freed_memory()  # before any thread starts (the lifeline's below; see its module doc)
    pause_collection()  # until the imports are done (_build)
    name = _mark_name()
    mark_process_start(name)
    parser = service_arg_parser("hybridflow-learner", "Serve the learner (rank 0) over gRPC.")
    args = parser.parse_args(argv)
    watch_parent()

    from hybridflow.job_config import load_job_config

    job = load_job_config(args.config, args.set)
    cfg = job.learner
    setup_torch_process(cfg.topology.num_threads)
    mark(name, "torch_imported")  # and the config loaded

    from hybridflow.services.learner.distributed import init_from_env

    dist_info = init_from_env(cfg.topology.device)
    mark(name, "process_group")
    log = setup_logging(f"learner{dist_info.rank}")
    return args, job, dist_info, log


def _build(job: JobConfig, dist_info: DistInfo, log: logging.Logger) -> _Learner | None:
    """Loads the model and wires this rank's core and command relay; None (the reason
    logged) when the model cannot be loaded."""
    from hybridflow.models import resolve_model_path
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.distributed import CommandRelay, control_group
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.utils.startup_gc import resume_collection
    from hybridflow.utils.startup_marks import mark
    from hybridflow.weights.client import GrpcWeightSyncClient

    resume_collection()  # before the model loads
    mark(_mark_name(), "imported")
    cfg = job.learner
    try:
        path = resolve_model_path(job.model)
        worker = LearnerWorker(cfg, path)
    except ValueError as exc:
        log.error("cannot load the model: %s", exc)
        return None
    mark(_mark_name(), "model_built")
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
    return _Learner(job, dist_info, log, worker, core, relay, channel)


def _serve_relayed(learner: _Learner) -> None:
    """Another rank than 0: runs the commands rank 0 relays until its "shutdown"."""
    import signal

    log = learner.log
    # torchrun forwards SIGTERM to every rank at once, and a Ctrl-C or a scheduler's stop
    # reaches the whole process group as SIGINT: the others must outlive rank 0's drain and
    # leave on its relayed "shutdown", or rank 0's last broadcast fails.
    for signum in (signal.SIGTERM, signal.SIGINT):
        name = signal.Signals(signum).name
        signal.signal(signum, lambda *_, name=name: log.info("%s: waiting for rank 0", name))
    log.info("rank %d serving relayed commands", learner.dist_info.rank)
    learner.relay.serve()


def _serve(learner: _Learner, port_file: str | None) -> None:
    """Rank 0: serves gRPC (``LearnerService``: each command through the relay, the info the
    coordinator asks for, checkpoints under ``checkpoint_dir``; its address to ``port_file``)
    until SIGTERM / SIGINT, then drains, stops and relays "shutdown" to the other ranks."""
    from hybridflow.main.bootstrap import serve
    from hybridflow.services.learner.convert import learner_info_to_proto
    from hybridflow.services.learner.servicer import SERVICE_NAME, LearnerServicer
    from hybridflow.types import LearnerInfo

    job, worker, core, channel = learner.job, learner.worker, learner.core, learner.channel
    cfg = job.learner

    def info() -> LearnerInfo:
        return LearnerInfo(
            model=job.model,
            algorithm=cfg.algorithm,
            policy_version=worker.policy_version,
            world_size=learner.dist_info.world_size,
            needs_greedy_baseline=core.needs_greedy_baseline(),
            needs_routed_experts=core.needs_routed_experts(),
            versions_per_step=worker.versions_per_step(),
        )

    from hybridflow.weights.client import ReplicaProber

    servicer = LearnerServicer(
        dispatch=learner.relay.call,
        info=lambda: learner_info_to_proto(info()),
        vocab_size=worker.vocab_size,
        max_bytes=cfg.server.max_message_bytes,
        chunk_bytes=channel.chunk_bytes,
        checkpoint_root=cfg.checkpoint_dir,
        weight_sync=job.weight_sync,
        channel=channel,
        probe=ReplicaProber(),  # one kept channel per replica: a probe is one round trip
        finish_publish=core.finish_publish,
    )

    def metrics(running: RunningServer) -> None:
        if running.metrics is not None:
            running.metrics.gauge(
                "hybridflow_policy_version", "Policy version trained", lambda: worker.policy_version
            )
            running.metrics.gauge(
                "hybridflow_weight_sync_last_seconds",
                "Seconds of the last weight publish to the rollout replicas",
                lambda: servicer.last_publish_s,
            )

    topology = cfg.topology
    serve(
        _mark_name(),
        cfg.server,
        servicer.add_to_server,
        [SERVICE_NAME],
        port_file=port_file,
        log=learner.log,
        ready=lambda address: (
            f"learner ready on {address} (world "
            f"{learner.dist_info.world_size}, {topology.critic_nproc_per_node} of them critic "
            f"ranks, {cfg.algorithm})"
        ),
        on_start=metrics,
        on_stop=learner.relay.shutdown,
    )


def _mark_name() -> str:
    """This rank's name in the start-up marks: ``learner`` and its torchrun rank."""
    import os

    return f"learner{os.environ.get('RANK', '0')}"


if __name__ == "__main__":
    from hybridflow.utils.fast_exit import exit_service

    exit_service(main())
