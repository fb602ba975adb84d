"""Rollout replica process: ``python -m hybridflow.main.rollout --config job.yaml``.

Exits non-zero (``EXIT_ENGINE_DEAD``) when its engine dies (a vLLM worker process gone), so
the launcher's supervisor restarts it like a dead service instead of keeping a replica that
answers but cannot generate. A SIGTERM / SIGINT at any moment, engine start included, ends it
through the same path, which releases the shared memory and semaphores the engine made
(``services/ipc.py``).
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

    from hybridflow.job_config import JobConfig
    from hybridflow.rpc.server import RunningServer
    from hybridflow.services.rollout.local import LocalRollout

EXIT_ENGINE_DEAD = 3
"""Exit code of a replica whose engine died: restartable, unlike bad configuration (2)."""


def _stop_starting(signum: int, _frame: Any) -> None:
    """Until the server serves, a stop signal ends the start-up (finalisers and cleanup run)."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    from hybridflow.main.bootstrap import service_arg_parser
    from hybridflow.utils.malloc import keep_freed_memory
    from hybridflow.utils.startup_gc import pause_collection
    from hybridflow.utils.startup_marks import mark_process_start

    keep_freed_memory()  # before any thread starts (the lifeline's in _serve; its module doc)
    pause_collection()  # until the imports are done (_serve)

    parser = service_arg_parser("hybridflow-rollout", "Serve one rollout replica over gRPC.")
    parser.add_argument("--replica-index", type=int, default=0, help="index among replicas")
    args = parser.parse_args(argv)
    mark_process_start(f"rollout{args.replica_index}")
    from hybridflow.services.ipc import IpcLedger

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_starting)
    ledger = IpcLedger.install()  # before anything allocates shared memory
    engines: list[Any] = []
    try:
        return _serve(args, engines)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # the cleanup is not interrupted half-way
        try:
            for engine in engines:
                engine.close()
        finally:
            ledger.release()


def _serve(args: Any, engine_box: list[Any]) -> int:
    """Builds the engine (into ``engine_box``, so the caller closes it whatever happens),
    serves until a signal or the engine's death; returns the exit code."""
    from hybridflow.main.bootstrap import serve, setup_logging, setup_torch_process, watch_parent
    from hybridflow.utils.startup_gc import resume_collection
    from hybridflow.utils.startup_marks import mark

    name = f"rollout{args.replica_index}"
    watch_parent()
    log = setup_logging(name)

    from hybridflow.job_config import load_job_config

    job = load_job_config(args.config, args.set)
    cfg = job.rollout
    setup_torch_process(cfg.num_threads)

    from hybridflow.models import resolve_model_path
    from hybridflow.services.rollout.engines import build_engine
    from hybridflow.services.rollout.local import LocalRollout

    if cfg.engine == "hf":  # its module (transformers) imports with the collector paused too
        import hybridflow.services.rollout.engine  # noqa: F401
    # Before the engine builds: a model's tensors, and a vLLM engine's worker processes,
    # which must not inherit a paused collector.
    resume_collection()
    mark(name, "imported")  # and the config loaded
    if cfg.server.port:
        cfg.server.port += args.replica_index  # a fixed base port: one port per replica
    if cfg.server.metrics_port:
        cfg.server.metrics_port += args.replica_index
    try:
        path = resolve_model_path(job.model)
        lora = job.learner.lora if job.learner.lora.enabled else None
        engine = build_engine(cfg, path, args.replica_index, lora, job.weight_sync.lora)
        engine_box.append(engine)
        mark(name, "engine_built")
    except ValueError as exc:
        log.error("cannot start the %s engine: %s", cfg.engine, exc)
        return 2
    rollout = LocalRollout(engine, job.model, cfg.engine, cfg.in_flight_weights)
    register, names = _services(job, rollout)
    dead = threading.Event()  # set by a signal too
    serve(
        name,
        cfg.server,
        register,
        names,
        port_file=args.port_file,
        log=log,
        ready=lambda address: (
            f"rollout replica {args.replica_index} ready on {address} (model {path})"
        ),
        on_start=lambda running: _on_start(running, engine, rollout, dead),
        stop=dead,
    )
    dead_reason = engine.dead_reason
    if dead_reason is None:
        return 0
    log.error(
        "rollout replica %d exits with code %d: %s",
        args.replica_index,
        EXIT_ENGINE_DEAD,
        dead_reason,
    )
    return EXIT_ENGINE_DEAD


def _services(job: JobConfig, rollout: LocalRollout) -> tuple[Any, list[str]]:
    """What the replica serves, with the job's bounds: ``RolloutService`` (generation) and
    ``WeightSyncService`` (updates from the learner); a ``register`` for the server and the
    names health reports."""
    from hybridflow.services.rollout.requests import RequestLimits
    from hybridflow.services.rollout.servicer import SERVICE_NAME, RolloutServicer
    from hybridflow.weights.servicer import SERVICE_NAME as WEIGHT_SYNC_SERVICE
    from hybridflow.weights.servicer import WeightSyncServicer

    cfg = job.rollout
    limits = RequestLimits(
        cfg.max_n, cfg.max_new_tokens_limit, cfg.max_prompts_per_request, cfg.max_tokens_per_request
    )
    servicer = RolloutServicer(
        rollout,
        cfg.prompts_per_message,
        cfg.server.max_message_bytes,
        limits,
        message_bytes=cfg.message_bytes,
    )
    weights = WeightSyncServicer(rollout, None, job.weight_sync)

    def register(server: grpc.Server) -> None:
        servicer.add_to_server(server)
        weights.add_to_server(server)

    return register, [SERVICE_NAME, WEIGHT_SYNC_SERVICE]


def _on_start(
    running: RunningServer, engine: Any, rollout: LocalRollout, dead: threading.Event
) -> None:
    """The replica's metrics; an engine that dies (a worker process gone) stops serving and
    sets ``dead``, which ends the replica."""
    if running.metrics is not None:
        running.metrics.counter(
            "hybridflow_rollout_generated_tokens",
            "Completion tokens generated (rate: tokens/s)",
            lambda: rollout.status().num_generated_tokens,
        )
        running.metrics.gauge(
            "hybridflow_policy_version", "Policy version served", lambda: rollout.policy_version
        )

    def on_dead(reason: str) -> None:
        running.set_serving(False)
        dead.set()

    engine.on_dead(on_dead)  # called at once if it died before


if __name__ == "__main__":
    from hybridflow.utils.fast_exit import exit_service

    exit_service(main())
