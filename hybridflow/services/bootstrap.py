"""What every service's ``__main__`` does before its own work: args, logging, threads, and
``watch_parent`` (end with the launcher that started it; a no-op when started by hand).
After it: ``hybridflow.utils.fast_exit.exit_service``.

Kept free of torch and grpc at import time so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from hybridflow.deploy.lifeline import watch_parent

__all__ = ["service_arg_parser", "set_torch_threads", "setup_logging", "watch_parent"]


def service_arg_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="job YAML (e.g. deploy/configs/quickstart.yaml)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override, e.g. --set rollout.server.port=50051 (repeatable)",
    )
    parser.add_argument("--port-file", help="write the bound host:port here once serving")
    return parser


def setup_logging(name: str) -> logging.Logger:
    level = os.environ.get("HYBRIDFLOW_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    return logging.getLogger(name)


def set_torch_threads(num_threads: int) -> None:
    """Services share the machine's cores; oversubscribed OpenMP threads run 10-60x slower."""
    import torch

    if num_threads > 0:
        torch.set_num_threads(num_threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
