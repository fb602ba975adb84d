"""What every service's ``__main__`` shares: before its own work, the args, logging,
threads and ``watch_parent`` (end with the launcher that started it; a no-op when started by
hand); after it, ``serve`` (server, ready line, port file, signals, drain). Its last line:
``hybridflow.utils.fast_exit.exit_service``.

Kept free of torch and grpc at import time so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hybridflow.deploy.lifeline import watch_parent
from hybridflow.utils.config_args import add_config_args

if TYPE_CHECKING:
    import grpc

    from hybridflow.rpc.config import ServerConfig
    from hybridflow.rpc.server import RunningServer

__all__ = ["serve", "service_arg_parser", "setup_torch_process", "setup_logging", "watch_parent"]


def service_arg_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_config_args(parser)
    parser.add_argument("--port-file", help="write the bound host:port here once serving")
    return parser


def setup_logging(name: str) -> logging.Logger:
    level = os.environ.get("HYBRIDFLOW_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    # an agent's OpenAI client logs every request at INFO: a line per episode turn
    if level != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)
    return logging.getLogger(name)


def setup_torch_process(num_threads: int) -> None:
    """What a process that runs torch compute sets first: its threads (services share the
    machine's cores; oversubscribed OpenMP threads run 10-60x slower) and an allocator that
    keeps freed memory for the next step (``hybridflow.utils.malloc``;
    ``HYBRIDFLOW_MALLOC=system`` opts out)."""
    from hybridflow.utils.malloc import keep_freed_memory

    keep_freed_memory()  # before torch's import starts a thread (see its module doc)
    import torch

    if num_threads > 0:
        torch.set_num_threads(num_threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))


def serve(
    name: str,
    server: ServerConfig,
    register: Callable[[grpc.Server], None],
    service_names: Sequence[str],
    *,
    port_file: str | None,
    log: logging.Logger,
    ready: Callable[[str], str],
    on_start: Callable[[RunningServer], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serves until SIGTERM / SIGINT, or until ``stop`` is set (the service cannot serve any
    more), then drains (``server.grace_s``) and calls ``on_stop``.

    In order: the gRPC server starts with ``register``'s services (health and reflection
    added; ``service_names`` are the names health reports), ``on_start`` gets it (metrics,
    watches), ``ready(address)`` is logged, the address goes to ``port_file`` (last: whoever
    waits for the file finds the ready line logged) and the ``serving`` start-up mark is set.
    """
    from hybridflow.rpc.server import serve_until_signal, start_server, write_port_file
    from hybridflow.utils.startup_marks import mark

    running = start_server(server, register, list(service_names))
    if on_start is not None:
        on_start(running)
    log.info("%s", ready(running.address))
    if port_file:
        write_port_file(port_file, running.address)
    mark(name, "serving")
    serve_until_signal(running, server.grace_s, on_stop=on_stop, stop=stop)
